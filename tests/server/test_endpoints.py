"""Every endpoint, over HTTP and gRPC, through unmodified tritonclient; outputs equal the engine's."""

from __future__ import annotations

import json
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from boundgen.server.kserve import pb
from tests.server.conftest import BEAM_SPEC, SCORE_SPEC
from tests.server.fake_engine import FakeEngine

TEXTS = ["hello world", "héllo wörld ✓", "a b c"]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def client(protocol, server):
    return thttp.InferenceServerClient(server.http_url) if protocol == "http" else tgrpc.InferenceServerClient(server.grpc_url)


def text_input(protocol, texts, binary=True):
    mod = thttp if protocol == "http" else tgrpc
    tensor = mod.InferInput("TEXT", [len(texts)], "BYTES")
    data = np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object)
    if protocol == "http":
        tensor.set_data_from_numpy(data, binary_data=binary)
    else:
        tensor.set_data_from_numpy(data)
    return tensor


def http_get(server, path):
    with NO_PROXY.open(f"http://{server.http_url}{path}", timeout=10) as r:
        return r.status, r.read()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_health_and_metadata(fake_server, protocol):
    c = client(protocol, fake_server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("fscore") and c.is_model_ready("fbeam")
    server_meta = c.get_server_metadata() if protocol == "http" else json.loads(
        _grpc_json(c.get_server_metadata(as_json=True)))
    assert server_meta["name"] == "boundgen"
    meta = c.get_model_metadata("fscore") if protocol == "http" else json.loads(
        _grpc_json(c.get_model_metadata("fscore", as_json=True)))
    assert meta["name"] == "fscore" and meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [("TEXT", "BYTES", [-1])]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]] == [("SCORES", "FP32", [-1, 2]),
                                                                                            ("NUM_TOKENS", "INT32", [-1])]
    beam = c.get_model_metadata("fbeam") if protocol == "http" else json.loads(
        _grpc_json(c.get_model_metadata("fbeam", as_json=True)))
    assert [(t["name"], [int(d) for d in t["shape"]]) for t in beam["outputs"]] == [
        ("TOKEN_IDS", [3, 2]), ("SCORES", [3]), ("TEXT_OUT", [3])]


def _grpc_json(obj):
    return obj if isinstance(obj, str) else json.dumps(obj)


def test_metadata_lists_shape_bounds(fake_server):
    meta = thttp.InferenceServerClient(fake_server.http_url).get_model_metadata("fscore")
    assert meta["parameters"]["max_samples"] == 4 and meta["parameters"]["max_tokens_per_sample"] == 8
    channel = grpc.insecure_channel(fake_server.grpc_url)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=pb.ModelMetadataResponse.FromString)
    response = call(pb.ModelMetadataRequest(name="fbeam"), timeout=10)
    assert response.parameters["width"].int64_param == 3 and response.parameters["steps"].int64_param == 2
    channel.close()


@pytest.mark.parametrize("protocol,binary", [("http", True), ("http", False), ("grpc", True)])
def test_score_equals_engine(fake_server, protocol, binary):
    c = client(protocol, fake_server)
    outputs = [thttp.InferRequestedOutput("SCORES", binary_data=binary)] if protocol == "http" else None
    result = c.infer("fscore", [text_input(protocol, TEXTS, binary)], outputs=outputs, request_id="r1")
    expected = FakeEngine(SCORE_SPEC).score(TEXTS).scores
    got = result.as_numpy("SCORES")
    assert got.dtype == np.float32 and got.shape == (3, 2)
    np.testing.assert_array_equal(got, expected)
    response = result.get_response()
    assert (response["id"] if protocol == "http" else response.id) == "r1"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_beam_equals_engine(fake_server, protocol):
    c = client(protocol, fake_server)
    result = c.infer("fbeam", [text_input(protocol, ["a prompt"])])
    expected = FakeEngine(BEAM_SPEC).beam("a prompt")
    np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
    assert result.as_numpy("TOKEN_IDS").dtype == np.int32
    np.testing.assert_array_equal(result.as_numpy("SCORES"), expected.scores)
    assert [t.decode() for t in result.as_numpy("TEXT_OUT")] == expected.texts


def test_requested_output_subset(fake_server):
    c = thttp.InferenceServerClient(fake_server.http_url)
    result = c.infer("fbeam", [text_input("http", ["x"])], outputs=[thttp.InferRequestedOutput("TEXT_OUT")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["TEXT_OUT"]


def test_http_json_only_request(fake_server):
    """A plain JSON request (no binary extension, no tritonclient) gets a plain JSON answer."""
    body = json.dumps({"id": "7", "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}]})
    request = urllib.request.Request(f"http://{fake_server.http_url}/v2/models/fscore/versions/1/infer",
                                     data=body.encode(), headers={"Content-Type": "application/json"})
    with NO_PROXY.open(request, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["id"] == "7" and answer["outputs"][0]["shape"] == [2, 2]
    expected = FakeEngine(SCORE_SPEC).score(TEXTS[:2]).scores
    np.testing.assert_array_equal(np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(2, 2), expected)


def test_grpc_typed_contents(fake_server):
    """BYTES in InferTensorContents.bytes_contents instead of raw_input_contents."""
    channel = grpc.insecure_channel(fake_server.grpc_url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=pb.ModelInferResponse.FromString)
    request = pb.ModelInferRequest(model_name="fscore")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([t.encode() for t in TEXTS[:2]])
    response = infer(request, timeout=10)
    got = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 2)
    np.testing.assert_array_equal(got, FakeEngine(SCORE_SPEC).score(TEXTS[:2]).scores)
    channel.close()


def test_metrics_endpoint(fake_server):
    c = thttp.InferenceServerClient(fake_server.http_url)
    c.infer("fscore", [text_input("http", ["counted once"])])
    status, body = http_get(fake_server, "/metrics")
    text = body.decode()
    assert status == 200
    for name in ('boundgen_requests_total{model="fscore",outcome="success",protocol="http"}',
                 'boundgen_request_seconds_bucket{le="0.02",model="fscore",protocol="http"}',
                 'boundgen_queue_seconds_count{model="fscore"}', 'boundgen_compute_seconds_count{model="fscore"}',
                 'boundgen_inflight_requests{model="fscore"}', 'boundgen_queue_depth{model="fscore"}',
                 "boundgen_ready 1.0"):
        assert name in text, name


def test_live_and_ready_over_plain_http(fake_server):
    # The Open Inference Protocol's bodies, as kserve's Python SDK parses them.
    assert http_get(fake_server, "/v2/health/live") == (200, b'{"live": true}')
    status, body = http_get(fake_server, "/v2/health/ready")
    assert status == 200 and json.loads(body) == {"ready": True}
    assert http_get(fake_server, "/v2/models/fscore/ready")[0] == 200
    status, body = http_get(fake_server, "/v2")
    assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]


def test_server_needs_neither_tritonclient_nor_torch():
    """The GPU machine has no tritonclient; the server layer must not import it (nor torch, which
    only the engine loads)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['tritonclient'] = None\n"
            "import boundgen.server.app, boundgen.server.deploy.launch, boundgen.cli.serve\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
