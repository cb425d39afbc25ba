"""An Engine that forwards each call to one worker process over gRPC (KServe ModelInfer).

The front end of `boundgen serve --replicas/--gpus` serves one `ReplicaEngine` per model, so its
admission, deadlines and metrics are the ordinary ones (app.py, admission.py). Each call runs on
an admission worker thread: it picks a worker (`WorkerPool.acquire`: fewest requests in flight),
sends the validated texts, and rebuilds the engine result from the answer's raw output tensors.

The request's deadline goes with it, as the remaining time in the KServe `timeout` parameter
(microseconds, rounded down): the worker's admission and engine then drop it, unrun, if it
expires while waiting there. (A relative time, as gRPC deadlines are; the worker's deadline is
later than the front end's by the time the request takes to reach it, and the front end drops
an answer that comes after its own.) So does its `cancelled` event: once the front end's client
has gone, the call to the worker is cancelled (replicas.Worker.infer), and the worker's admission
and engine drop the request, unless it already runs (worker outcome label cancelled).

The gRPC call itself carries the same deadline plus WORKER_GRACE_S (so that a worker refusing
the request at its deadline is heard, with its reason): a worker that does not answer in time
(stopped, wedged, overloaded) fails the request with 504 within WORKER_GRACE_S of its deadline
(and the front end's own handling: 0.2 s in all, documented), never later; without a deadline
the call is bounded by WORKER_CALL_TIMEOUT_S. A worker that dies under a request, or refuses it
as unavailable, has the request sent once more to another live worker with the time left (the
request's answer is lost with the worker, and inference has no side effects); with none, or
when the retry fails too, 503 / UNAVAILABLE. Other worker statuses map back to the front end's
own errors.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import grpc
import numpy as np

from boundgen.artifact.program import spec_from_dict
from boundgen.errors import Cancelled, InvalidInput
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.server.kserve import pb
from boundgen.server.status import DeadlineExceeded, Overloaded, Unavailable
from boundgen.server.kserve.tensors import from_raw, serialize_bytes

WORKER_CALL_TIMEOUT_S = 600.0  # bound on a forwarded call that brings no deadline
# A forwarded call's own timeout: the request's time left plus this, long enough to hear a worker's
# own 504 (its deadline is later than ours by the request's trip), short enough that a silent worker
# fails the request within the documented 0.2 s of its deadline (0.2 s of grace gave 0.20-0.26 s).
WORKER_GRACE_S = 0.1

_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)  # the worker went away (mid-call: CANCELLED)
_OUTCOMES = {  # of boundgen_worker_requests_total; anything else is "error"
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.CANCELLED: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
}


class _WorkerGone(Exception):
    """A worker answered UNAVAILABLE or CANCELLED: it is gone (or going)."""


def spec_from_metadata(meta: dict, concurrency: int) -> EngineSpec:
    """The EngineSpec a worker's HTTP model metadata describes (signature.py's `parameters()`)."""
    vocab = any(o.get("name") == "LABEL_LOGPROBS" for o in meta.get("outputs", []))
    return EngineSpec(meta["name"], spec_from_dict(meta["parameters"]), concurrency=concurrency, vocab_outputs=vocab)


class ReplicaEngine(Engine):
    def __init__(self, pool, spec: EngineSpec):
        self.pool, self.spec = pool, spec

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        wanted = ("SCORES", "NUM_TOKENS") + (("LABEL_LOGPROBS",) if self.spec.vocab_outputs else ())
        out = self._forward(texts, deadline, cancelled, wanted)
        return ScoreResult(out["SCORES"], list(self.spec.program.label_token_ids), {},
                           label_logprobs=out.get("LABEL_LOGPROBS"), num_tokens=out.get("NUM_TOKENS"))

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        out = self._forward([text], deadline, cancelled)
        ids = out["TOKEN_IDS"]
        texts = [t.decode("utf-8") for t in out["TEXT_OUT"]]
        return BeamResult(ids, out["SCORES"], (ids == -1).any(axis=1), texts, {})

    def warmup(self) -> None:
        pass  # every worker warmed its own engine before it answered ready

    def close(self) -> None:
        self.pool.close()

    def _forward(self, texts: Sequence[str], deadline: float | None, cancelled: threading.Event | None,
                 outputs: Sequence[str] = ()) -> dict:
        """The worker's output tensors by name: `outputs`, or its default ones when empty."""
        items = [t.encode("utf-8") for t in texts]
        request = pb.ModelInferRequest(model_name=self.spec.name)
        for name in outputs:
            request.outputs.add(name=name)
        request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(items)])
        request.raw_input_contents.append(serialize_bytes(items))
        call_timeout_s = WORKER_CALL_TIMEOUT_S
        if deadline is not None:
            left_s = deadline - time.monotonic()
            call_timeout_s = left_s + WORKER_GRACE_S
            left_us = int(left_s * 1e6)
            if left_us <= 0:  # 0 would mean "no timeout" to the worker
                raise DeadlineExceeded(f"the deadline passed {-left_us / 1e3:.1f} ms before model {self.spec.name} "
                                       "could be sent to a worker; the request was not run")
            request.parameters["timeout"].int64_param = left_us
        if cancelled is not None and cancelled.is_set():
            raise Cancelled(f"the request was cancelled before model {self.spec.name} could be sent to a worker; "
                            "it was not run")
        response = self._call(request, call_timeout_s, cancelled)
        out = {}
        for t, raw in zip(response.outputs, response.raw_output_contents):
            tensor = from_raw(t.name, t.datatype, tuple(t.shape), raw)
            data = tensor.data if t.datatype == "BYTES" else np.asarray(tensor.data).reshape(tensor.shape)
            out[t.name] = data
        return out

    def _call(self, request, call_timeout_s: float, cancelled: threading.Event | None):
        """The response of a worker to `request`. A request whose worker is gone (UNAVAILABLE or
        CANCELLED from it: it died under the request, or a moment before, while its channel still
        looked connected) is sent once more, to another live worker, with the time still left:
        inference has no side effects, and the dead worker's answer, if any, is lost."""
        call_end = time.monotonic() + call_timeout_s
        gone = None
        while True:
            try:
                worker = self.pool.acquire(besides=gone)
            except Unavailable:
                if gone is None:
                    raise
                raise Unavailable(f"worker {gone.index} went away under the request and no other worker is up; "
                                  "retry later") from None
            try:
                return self._send(worker, request, call_end, cancelled)
            except _WorkerGone as exc:
                left_s = call_end - time.monotonic() - WORKER_GRACE_S
                if gone is not None or left_s <= 0 or (cancelled is not None and cancelled.is_set()):
                    raise Unavailable(str(exc)) from None
                gone = worker
                if "timeout" in request.parameters:
                    request.parameters["timeout"].int64_param = max(1, int(left_s * 1e6))

    def _send(self, worker, request, call_end: float, cancelled: threading.Event | None):
        """One call of `request` to `worker`, counted by outcome; _WorkerGone if the worker is gone."""
        outcome = "error"
        try:
            response = worker.infer(request, call_end - time.monotonic(), cancelled)
            outcome = "success"
            return response
        except grpc.FutureCancelledError:
            outcome = "cancelled"
            raise Cancelled(f"worker {worker.index}: the request was cancelled; the worker runs it only if it "
                            "had already started") from None
        except grpc.RpcError as err:
            outcome = _OUTCOMES.get(err.code(), "error")
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() >= call_end:  # ours, not the worker's
                raise DeadlineExceeded(f"worker {worker.index} did not answer model {self.spec.name} by the "
                                       "request's deadline (is it stalled?); the answer, if any, is dropped") from None
            if err.code() in _GONE:
                raise _WorkerGone(f"worker {worker.index}: {err.details()}") from None
            raise _ERRORS.get(err.code(), RuntimeError)(f"worker {worker.index}: {err.details()}") from None
        finally:
            self.pool.release(worker, outcome)
