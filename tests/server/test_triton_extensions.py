"""Triton's extensions through unmodified tritonclient (http and grpc): model config, statistics,
repository index, the refused repository load / unload, trace settings (log settings:
test_logs.py; shared memory: test_shared_memory.py). The gRPC answers are parsed by tritonclient's
own messages, so they also prove kserve.proto's field numbers are Triton's."""

from __future__ import annotations

import json

import pytest
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from boundgen.server.kserve import pb
from tests.server.conftest import SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact
from tests.server.test_endpoints import NO_PROXY, client, text_input


def _triton_message(name: str):
    for module in (service_pb2, model_config_pb2):
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"Triton has no message {name}")


ADDITIONS = {"inference.ModelMetadataResponse.parameters"}  # boundgen's, documented in kserve.proto


def _check_fields(ours, theirs) -> None:
    for field in ours.fields:
        if field.full_name in ADDITIONS:  # Triton's clients skip it: its number must be free there
            assert field.number not in theirs.fields_by_number, field.full_name
            continue
        assert field.name in theirs.fields_by_name, f"{ours.full_name}.{field.name} is not Triton's"
        other = theirs.fields_by_name[field.name]
        where = f"{ours.full_name}.{field.name}"
        assert (field.number, field.type, field.is_repeated) == (other.number, other.type, other.is_repeated), where
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            assert field.message_type.full_name == other.message_type.full_name, where
            _check_fields(field.message_type, other.message_type)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            assert field.enum_type.full_name == other.enum_type.full_name, where
            values = {v.name: v.number for v in other.enum_type.values}
            assert all(values[v.name] == v.number for v in field.enum_type.values), where


def test_every_message_and_method_is_wire_compatible_with_triton():
    for name, ours in pb.DESCRIPTOR.message_types_by_name.items():
        _check_fields(ours, _triton_message(name))
    triton = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        other = triton.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            other.input_type.full_name, other.output_type.full_name), method.name
        assert (method.client_streaming, method.server_streaming) == (
            other.client_streaming, other.server_streaming), method.name
    ours = {m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert ours == {m.name for m in triton.methods}, "every method of Triton's service is declared"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_config(fake_server, protocol):
    c = client(protocol, fake_server)
    if protocol == "http":
        score, beam = c.get_model_config("fscore"), c.get_model_config("fbeam", "1")
    else:  # parsed by tritonclient's ModelConfigResponse, shown as protobuf JSON
        score, beam = (_json(c.get_model_config(name, as_json=True))["config"] for name in ("fscore", "fbeam"))
    assert score["name"] == "fscore" and score["platform"] == "boundgen"
    assert int(score.get("max_batch_size", 0)) == 0
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in score["input"]] == [
        ("TEXT", "TYPE_STRING", [-1])]
    # NUM_TOKENS (each sample's tokens) on every score model; LABEL_LOGPROBS only where the artifact
    # returns the vocabulary's log-sum-exp (the fake engine's, like an artifact built before, does not)
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in score["output"]] == [
        ("SCORES", "TYPE_FP32", [-1, 2]), ("NUM_TOKENS", "TYPE_INT32", [-1])]
    assert [(g["kind"], int(g["count"])) for g in score["instance_group"]] == [("KIND_CPU", 1)]
    assert score["parameters"]["task"] == {"string_value": "score"}
    assert json.loads(score["parameters"]["max_samples"]["string_value"]) == SCORE_SPEC.program.max_samples
    # How this server serves it (a replica front end reads these instead of a log line): the
    # shared fake server runs with --max-inflight 2, and the artifact it loaded.
    assert score["parameters"]["max_inflight"] == {"string_value": "2"}
    # ... by its directory's name: the server's own paths stay on the server
    assert score["parameters"]["artifact"] == {"string_value": "fscore"}
    assert "artifact_dir" not in score["parameters"]
    assert not any("/" in value["string_value"] for value in score["parameters"].values())
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in beam["output"]] == [
        ("TOKEN_IDS", "TYPE_INT32", [3, 2]), ("SCORES", "TYPE_FP32", [3]), ("TEXT_OUT", "TYPE_STRING", [3])]
    assert "dynamic_batching" not in score  # the shared fake server does not batch
    with pytest.raises(InferenceServerException) as err:
        c.get_model_config("nope")
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT") and "unknown model" in err.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_config_says_when_the_engine_batches(launch, tmp_path, protocol):
    """Read with tritonclient's own (full Triton) protos over gRPC: the field numbers agree."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)], args=["--batching"])
    c = client(protocol, server)
    if protocol == "http":
        assert c.get_model_config("fscore")["dynamic_batching"] == {"max_queue_delay_microseconds": 0}
    else:
        config = c.get_model_config("fscore").config
        assert config.HasField("dynamic_batching") and config.dynamic_batching.max_queue_delay_microseconds == 0
        assert config.max_batch_size == 0 and config.name == "fscore"


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def test_statistics_count_what_the_server_measured(launch, tmp_path):
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)])
    http, grpc_client = client("http", server), client("grpc", server)
    http.infer("fscore", [text_input("http", ["one sleep=0.02"])])
    grpc_client.infer("fscore", [text_input("grpc", ["two", "three"])])
    with pytest.raises(InferenceServerException):  # an empty batch: a failure, never queued
        http.infer("fscore", [text_input("http", [])])

    by_http = http.get_inference_statistics("fscore")["model_stats"]
    everything = http.get_inference_statistics()["model_stats"]
    by_grpc = _json(grpc_client.get_inference_statistics("fscore", as_json=True))["model_stats"]
    assert [s["name"] for s in everything] == ["fscore"]
    for stats in (by_http[0], everything[0], by_grpc[0]):
        phases = {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in stats["inference_stats"].items()}
        assert stats["name"] == "fscore" and stats["version"] == "1"
        assert int(stats["inference_count"]) == 2 and int(stats["execution_count"]) == 2
        assert int(stats["last_inference"]) > 0
        assert phases["success"][0] == 2 and phases["fail"][0] == 1 and phases["queue"][0] == 2
        assert phases["compute_infer"][0] == 2 and phases["compute_infer"][1] >= 20_000_000  # the sleep=0.02
        assert phases["success"][1] >= phases["compute_infer"][1] + phases["queue"][1]
        assert phases["compute_input"][0] == 2  # the fake engine reports a "pre" stage
    with pytest.raises(InferenceServerException) as err:
        grpc_client.get_inference_statistics("nope")
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_repository_index_and_refused_load_unload(fake_server, protocol):
    c = client(protocol, fake_server)
    if protocol == "http":
        index = c.get_model_repository_index()
    else:
        index = _json(c.get_model_repository_index(as_json=True))["models"]
    assert [(m["name"], m["version"], m["state"]) for m in index] == [("fbeam", "1", "READY"), ("fscore", "1", "READY")]
    for call in (lambda: c.load_model("fscore"), lambda: c.unload_model("fscore")):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == ("400" if protocol == "http" else "StatusCode.UNAVAILABLE")
        assert "not supported" in err.value.message()
    assert c.is_model_ready("fscore")


def test_repository_refusal_is_a_json_body(fake_server):
    import urllib.request

    request = urllib.request.Request(f"http://{fake_server.http_url}/v2/repository/models/fscore/unload",
                                     data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        NO_PROXY.open(request, timeout=10)
    assert err.value.code == 400
    assert "repository unload (of fscore) is not supported" in json.loads(err.value.read())["error"]
    ready_only = urllib.request.Request(f"http://{fake_server.http_url}/v2/repository/index",
                                        data=b'{"ready": true}', method="POST")
    with NO_PROXY.open(ready_only, timeout=10) as r:
        assert [m["name"] for m in json.loads(r.read())] == ["fbeam", "fscore"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_trace_settings_say_nothing_is_traced(fake_server, protocol):
    c = client(protocol, fake_server)

    def get(model=None):
        if protocol == "http":
            return c.get_trace_settings(model)
        settings = _json(c.get_trace_settings(model, as_json=True))["settings"]
        return {key: value.get("value", []) if key == "trace_level" else value.get("value", [""])[0]
                for key, value in settings.items()}

    expected = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                "trace_file": "", "trace_mode": "triton"}
    assert get() == expected and get("fscore") == expected
    c.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": "1000"})  # restated: accepted
    c.update_trace_settings("fscore", settings={"trace_rate": None})  # back to the global value: accepted
    unsupported = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
    bad = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    for model, settings, status, message in (
            (None, {"trace_level": ["TIMESTAMPS"]}, unsupported, "this server does not trace requests"),
            ("fscore", {"trace_rate": "1"}, unsupported, "trace_rate stays 1000"),
            (None, {"trace_sample": "1"}, bad, "unknown trace setting 'trace_sample'"),
            ("nope", {}, bad, "unknown model 'nope'")):
        with pytest.raises(InferenceServerException) as err:
            c.update_trace_settings(model, settings=settings)
        assert err.value.status() == status and message in err.value.message(), err.value.message()
    assert get() == expected
