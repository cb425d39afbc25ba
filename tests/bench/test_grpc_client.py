"""The bench's gRPC client against a fake KServe v2 server on loopback (boundgen's own messages)."""

from concurrent import futures
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from boundgen.bench.grpc_client import GrpcTarget, decode_bytes, encode_bytes
from boundgen.bench.loadgen import closed_loop
from boundgen.server.kserve import pb


@dataclass
class Req:
    texts: tuple
    samples: int = 1


def _serve(infer):
    def ready(request, context):
        return pb.ModelReadyResponse(ready=request.name == "m")

    handler = grpc.method_handlers_generic_handler(pb.SERVICE, {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString),
        "ModelReady": grpc.unary_unary_rpc_method_handler(
            ready, request_deserializer=pb.ModelReadyRequest.FromString,
            response_serializer=pb.ModelReadyResponse.SerializeToString),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_bytes_codec():
    items = [b"", b"abc", "\u00e9t\u00e9".encode()]
    assert decode_bytes(encode_bytes(items), 3) == items


def test_score_over_raw_contents_and_errors():
    def infer(request, context):
        (tensor,) = request.inputs
        assert (request.model_name, tensor.name, tensor.datatype) == ("m", "TEXT", "BYTES")
        texts = decode_bytes(request.raw_input_contents[0], tensor.shape[0])
        if texts[0] == b"overload":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests in flight")
        resp = pb.ModelInferResponse(model_name="m")
        out = resp.outputs.add(name="SCORES", datatype="FP32", shape=[len(texts), 2])
        assert out.name == "SCORES"
        scores = np.array([[len(t), 1.0] for t in texts], dtype="<f4")
        resp.raw_output_contents.append(scores.tobytes())
        return resp

    server, address = _serve(infer)
    try:
        target = GrpcTarget(address, "m", "score")
        assert target.ready()
        result = target(Req(("a", "bcd", "\u00e9")))
        np.testing.assert_array_equal(result.scores, [[1, 1], [3, 1], [2, 1]])
        stats = closed_loop(target, [Req(("x",)), Req(("overload",))], 2, duration_s=30.0, warmup_s=0.0,
                            max_requests=20, progress=None)
        assert stats.errors.get("grpc.RESOURCE_EXHAUSTED", 0) > 0 and stats.completed > 0
        target.close()
    finally:
        server.stop(None)


def test_beam_over_typed_contents():
    def infer(request, context):
        resp = pb.ModelInferResponse(model_name="m")
        ids = resp.outputs.add(name="TOKEN_IDS", datatype="INT32", shape=[2, 3])
        ids.contents.int_contents.extend([1, 2, 3, 4, 5, -1])
        sc = resp.outputs.add(name="SCORES", datatype="FP32", shape=[2])
        sc.contents.fp32_contents.extend([-1.5, -2.5])
        tx = resp.outputs.add(name="TEXT_OUT", datatype="BYTES", shape=[2])
        tx.contents.bytes_contents.extend([b"one", b"two"])
        return resp

    server, address = _serve(infer)
    try:
        result = GrpcTarget(address, "m", "beam")(Req(("prompt",)))
        np.testing.assert_array_equal(result.token_ids, [[1, 2, 3], [4, 5, -1]])
        np.testing.assert_allclose(result.scores, [-1.5, -2.5])
        assert result.texts == ["one", "two"] and result.finished.tolist() == [False, True]
    finally:
        server.stop(None)


def test_task_is_checked():
    with pytest.raises(ValueError, match="score' or 'beam"):
        GrpcTarget("127.0.0.1:1", "m", "generate")
