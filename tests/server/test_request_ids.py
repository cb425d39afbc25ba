"""Request ids as clients and log collectors see them: the client's id (tritonclient's `headers=`:
HTTP X-Request-ID, gRPC metadata x-request-id) is echoed in every answer, errors included (HTTP
response header, gRPC trailing metadata), and is the access record's `request_id`; without one
(or with one that is not a plain token) the server makes one up and echoes that."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from boundgen.runtime.fair_queue import group_of
from boundgen.server import request_ids
from boundgen.server.kserve import pb
from tests.server.conftest import SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def logged(launch, tmp_path_factory):
    """A fake score server writing JSON access records."""
    root = tmp_path_factory.mktemp("request_ids")
    return launch([write_fake_artifact(root / "fscore", SCORE_SPEC)], args=["--access-log", "--log-format", "json"])


def access_records(server) -> list[dict]:
    lines = [json.loads(line) for line in server.output if line.startswith("{")]
    return [line for line in lines if line["logger"] == "boundgen.access"]


def wait_record(server, request_id: str) -> dict:
    """The access record of `request_id` (written when its answer was; read back from the output)."""
    import time

    end = time.monotonic() + 10
    while time.monotonic() < end:
        found = [r for r in access_records(server) if r["request_id"] == request_id]
        if found:
            (record,) = found
            return record
        time.sleep(0.02)
    raise AssertionError(f"no access record of {request_id}")


def text_input(module, texts):
    t = module.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([s.encode() for s in texts], dtype=object))
    return t


def http_answer(server, path: str, body: bytes | None = None, headers=None):
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, headers=headers or {})
    try:
        with NO_PROXY.open(request, timeout=10) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as err:
        return err.code, err.headers


def test_tritonclient_ids_are_logged_over_http_and_grpc(logged):
    http = thttp.InferenceServerClient(logged.http_url)
    http.infer("fscore", [text_input(thttp, ["one two"])], headers={"X-Request-ID": "http-id-1"})
    record = wait_record(logged, "http-id-1")
    assert (record["route"], record["status"], record["model"], record["protocol"], record["outcome"]) == (
        "POST /v2/models/fscore/infer", 200, "fscore", "http", "success")
    assert record["ms"] >= 0

    grpc_client = tgrpc.InferenceServerClient(logged.grpc_url)
    grpc_client.infer("fscore", [text_input(tgrpc, ["one two"])], headers={"x-request-id": "grpc-id-1"})
    record = wait_record(logged, "grpc-id-1")
    assert (record["route"], record["status"], record["protocol"], record["outcome"]) == (
        "/inference.GRPCInferenceService/ModelInfer", "OK", "grpc", "success")

    with pytest.raises(InferenceServerException):  # an error is logged with its id and status too
        grpc_client.infer("nope", [text_input(tgrpc, ["x"])], headers={"x-request-id": "grpc-id-2"})
    record = wait_record(logged, "grpc-id-2")
    assert (record["status"], record["outcome"], record["model"]) == ("INVALID_ARGUMENT", "invalid_input", "")
    with pytest.raises(InferenceServerException):
        http.infer("fscore", [text_input(thttp, ["too many words " * 4])], headers={"X-Request-ID": "http-id-2"})
    assert wait_record(logged, "http-id-2")["status"] == 400


def test_http_echoes_the_id_on_every_answer(logged):
    status, headers = http_answer(logged, "/v2/health/ready", headers={"X-Request-ID": "probe-7"})
    assert status == 200 and headers["X-Request-ID"] == "probe-7"
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}).encode()
    for path, want in (("/v2/models/nope/infer", 400), ("/no/such/route", 404), ("/v2/models/fscore/infer", 200)):
        status, headers = http_answer(logged, path, body, {"X-Request-ID": f"id-{want}"})
        assert status == want and headers["X-Request-ID"] == f"id-{want}", path
    status, headers = http_answer(logged, "/metrics")  # none given: one made up
    assert status == 200 and GENERATED.fullmatch(headers["X-Request-ID"])
    status, headers = http_answer(logged, "/metrics", headers={"X-Request-ID": "two words"})  # not a token
    assert GENERATED.fullmatch(headers["X-Request-ID"])


def test_grpc_echoes_the_id_in_trailing_metadata(logged):
    with grpc.insecure_channel(logged.grpc_url) as channel:
        def call(method, request, response_cls, metadata=()):
            stub = channel.unary_unary(f"/{pb.SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=response_cls.FromString)
            return stub.with_call(request, metadata=metadata, timeout=10)

        def echoed(metadata) -> str:
            (value,) = [v for k, v in metadata if k == "x-request-id"]
            return value

        _, answer = call("ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse, (("x-request-id", "live-1"),))
        assert echoed(answer.trailing_metadata()) == "live-1"
        request = pb.ModelInferRequest(model_name="fscore")
        request.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"a b")
        _, answer = call("ModelInfer", request, pb.ModelInferResponse, (("x-request-id", "infer-1"),))
        assert echoed(answer.trailing_metadata()) == "infer-1"
        _, answer = call("ModelInfer", request, pb.ModelInferResponse)
        assert GENERATED.fullmatch(echoed(answer.trailing_metadata()))
        request.model_name = "nope"
        with pytest.raises(grpc.RpcError) as err:
            call("ModelInfer", request, pb.ModelInferResponse, (("x-request-id", "infer-2"),))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert echoed(err.value.trailing_metadata()) == "infer-2"


def test_stream_requests_are_logged_under_the_streams_id(logged):
    answers = []
    client = tgrpc.InferenceServerClient(logged.grpc_url)
    client.start_stream(lambda result, error: answers.append((result, error)), headers={"x-request-id": "stream-9"})
    for _ in range(2):
        client.async_stream_infer("fscore", [text_input(tgrpc, ["a b"])])
    client.stop_stream()
    assert len(answers) == 2 and all(error is None for _, error in answers)
    for n in (1, 2):
        record = wait_record(logged, f"stream-9.{n}")
        assert record["route"] == "/inference.GRPCInferenceService/ModelStreamInfer" and record["status"] == "OK"


def test_a_client_is_its_id_else_its_host_alike_over_http_and_grpc():
    assert request_ids.client_key("team-7", "10.0.0.5") == "10.0.0.5 id:team-7"  # one of its host's clients
    assert group_of(request_ids.client_key("team-7", "10.0.0.5")) == group_of("10.0.0.5") == "10.0.0.5"
    assert request_ids.client_key("two words", "10.0.0.5") == "10.0.0.5"  # not one token: the address
    assert request_ids.client_key(None, None) == ""
    assert request_ids.client_key("team-7", "10.0.0.5", "id") == "id:team-7"  # serve --client-key id
    assert group_of("id:team-7") == "id:team-7"  # its own turn among all
    assert request_ids.client_key("team-7", "10.0.0.5", "address") == "10.0.0.5"  # serve --client-key address
    assert request_ids.grpc_peer_host("ipv4:127.0.0.1:50312") == "127.0.0.1"
    assert request_ids.grpc_peer_host("ipv6:[::1]:50312") == "::1"
    assert request_ids.grpc_peer_host("unix:/tmp/s") == "unix:/tmp/s"
