"""A KServe v2 gRPC client for the load generator, on plain grpcio and boundgen's own messages
(`boundgen.server.kserve.pb`), so that it runs where tritonclient is not installed.

Score model: TEXT BYTES [N] in, SCORES FP32 [N, L] out. Beam model: TEXT BYTES [1] in,
TOKEN_IDS INT32 [W, N_gen], SCORES FP32 [W], TEXT_OUT BYTES [W] out. Inputs go as raw contents
(as tritonclient sends them); outputs are read from raw contents or typed contents.
Results carry no timings: over RPC the whole latency counts as one piece.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from boundgen.artifact.tasks import task_named
from boundgen.bench.tasks import bench_task
from boundgen.runtime.results import TIMING_COUNTS

_LEN = struct.Struct("<I")
NUMPY_DTYPES = {"FP32": "<f4", "INT32": "<i4", "INT64": "<i8"}  # the output datatypes the models send


def _pb():
    from boundgen.server.kserve import pb as kserve_pb  # lazily: the bench imports without the server layer

    return kserve_pb


def encode_bytes(items) -> bytes:
    return b"".join(_LEN.pack(len(b)) + b for b in items)


def decode_bytes(raw: bytes, count: int) -> list[bytes]:
    out, pos = [], 0
    for _ in range(count):
        (n,) = _LEN.unpack_from(raw, pos)
        out.append(bytes(raw[pos + 4: pos + 4 + n]))
        pos += 4 + n
    return out


def server_timings(parameters) -> dict:
    """The stage timings a server answered (`timing_<stage>_ms` parameters) -> seconds by stage
    ("handler": the server's whole handling; TIMING_COUNTS as they are); {} when it sent none."""
    out = {}
    for key, value in parameters.items():
        if key.startswith("timing_") and key.endswith("_ms"):
            stage = key[len("timing_"):-len("_ms")]
            out[stage] = value.double_param if stage in TIMING_COUNTS else value.double_param / 1e3
    return out


def to_result(task: str, outs: dict):
    """Output tensors by name (BYTES as lists of bytes, the rest as arrays) -> ScoreResult | BeamResult."""
    return bench_task(task).result(outs)


class GrpcTarget:
    """Callable `request -> ScoreResult | BeamResult` against one model of a running server."""

    def __init__(self, address: str, model: str, task: str, timeout_s: float = 30.0, allow_subset: str | None = None,
                 allow_lists: Sequence[bytes] = ()):
        """allow_subset: every request names this subset of a constrained model's catalogue
        (ALLOW_SUBSET); allow_lists: raw int64 ALLOW_ITEMS, request i sending list i % len (so
        that the requests of a pool bring distinct lists, as distinct users do)."""
        import grpc

        bench_task(task)  # ValueError for a task that is none
        pb = _pb()
        self.pb, self.model, self.task, self.timeout_s = pb, model, task, timeout_s
        self.allow_subset, self.allow_lists = allow_subset, list(allow_lists)
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                                 ("grpc.max_send_message_length", 64 << 20)])
        prefix = f"/{pb.SERVICE}/"
        self._infer = self.channel.unary_unary(prefix + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                               response_deserializer=pb.ModelInferResponse.FromString)
        self._ready = self.channel.unary_unary(prefix + "ModelReady", request_serializer=pb.ModelReadyRequest.SerializeToString,
                                               response_deserializer=pb.ModelReadyResponse.FromString)

    def ready(self) -> bool:
        return bool(self._ready(self.pb.ModelReadyRequest(name=self.model), timeout=self.timeout_s).ready)

    def __call__(self, request):
        texts = task_named(self.task).request_texts(request.texts)
        req = self.pb.ModelInferRequest(model_name=self.model)
        self._add_raw(req, "TEXT", "BYTES", len(texts), encode_bytes([t.encode("utf-8") for t in texts]))
        if self.allow_lists:  # a constrained model's filters: an allow-list of this request's own
            ids = self.allow_lists[request.index % len(self.allow_lists)]
            self._add_raw(req, "ALLOW_ITEMS", "INT64", len(ids) // 8, ids)
        if self.allow_subset is not None:
            self._add_raw(req, "ALLOW_SUBSET", "BYTES", 1, encode_bytes([self.allow_subset.encode("utf-8")]))
        req.parameters[self.pb.TIMINGS_PARAMETER].bool_param = True  # the server's stage timings come back with the answer
        return self.parse(self._infer(req, timeout=self.timeout_s))

    @staticmethod
    def _add_raw(req, name: str, datatype: str, count: int, raw: bytes) -> None:
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.append(count)
        req.raw_input_contents.append(raw)

    def parse(self, resp):
        outs = {}
        for i, out in enumerate(resp.outputs):
            shape = tuple(int(d) for d in out.shape)
            count = int(np.prod(shape)) if shape else 1
            raw = resp.raw_output_contents[i] if i < len(resp.raw_output_contents) else None
            if out.datatype == "BYTES":
                data = decode_bytes(raw, count) if raw is not None else list(out.contents.bytes_contents)
                outs[out.name] = data
            else:
                dtype = NUMPY_DTYPES[out.datatype]
                if raw is not None:
                    arr = np.frombuffer(raw, dtype=dtype)
                else:
                    field = {"FP32": "fp32_contents", "INT32": "int_contents", "INT64": "int64_contents"}[out.datatype]
                    arr = np.asarray(getattr(out.contents, field), dtype=dtype)
                outs[out.name] = arr.reshape(shape)
        result = to_result(self.task, outs)
        result.timings = server_timings(resp.parameters)
        return result

    def close(self):
        self.channel.close()
