"""One served model: its engine, tensor signature and admission controller."""

from __future__ import annotations

import threading
from functools import partial

from boundgen.runtime.engine import Engine
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.server import request_ids
from boundgen.server.admission import Admission, Passage
from boundgen.server.metrics import ServerMetrics
from boundgen.server.signature import EngineCall, Signature

PLATFORM = "boundgen"
VERSION = "1"  # every model has exactly one version


def engine_concurrency(engine: Engine) -> int:
    """How many requests the engine works on at once: one per request context, times the requests
    one call holds when batching (more would wait inside the engine, unseen by the queue metrics;
    the engine still checks their deadlines and cancellations)."""
    return engine.spec.concurrency


def engine_contexts(engine: Engine) -> int:
    """The engine's request contexts (Triton's instance count)."""
    return engine.spec.runtime.contexts


class ServedModel:
    def __init__(self, engine: Engine, metrics: ServerMetrics, max_inflight: int | None, max_queue: int,
                 source: str = "", refusal_hold_s: float = 0.0):
        """source: the artifact directory the model was loaded from (its model config says it);
        refusal_hold_s: how late a full queue's 429 reaches a client with requests waiting (admission.py)."""
        self.engine, self.source = engine, source
        self.name = engine.spec.name
        self.signature = Signature(engine.spec)
        self.metrics = metrics
        if getattr(engine, "runs_async", False):  # a front-end process: the engine process admits
            self.admission = Passage(self.name, max_queue)
        else:
            self.admission = Admission(self.name, max_inflight or engine_concurrency(engine), max_queue,
                                       metrics.queue_observer(self.name), metrics.compute_observer(self.name),
                                       refusal_hold_s)
        metrics.track_model(self.name, lambda: self.admission.inflight, lambda: self.admission.queued)

    def metadata(self) -> dict:
        def tensors(specs):
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

        return {"name": self.name, "versions": [VERSION], "platform": PLATFORM,
                "inputs": tensors(self.signature.inputs), "outputs": tensors(self.signature.outputs),
                "parameters": self.signature.parameters()}

    async def run(self, call: EngineCall, deadline: float) -> ScoreResult | BeamResult:
        """Admit and run a checked request (what kserve/inference.py made of a request's tensors,
        or what a JSON route built); the engine's result, its stage timings in `result.timings`."""
        tag = request_ids.current()
        client = tag.client if tag is not None else ""  # whose turn in the queue (runtime/fair_queue.py)
        source = tag.source if tag is not None else ""  # its address: refusals held by address too
        # The engine gets the deadline and the cancelled event (set by the admission when the
        # client goes away) too: a request still waiting inside it (for a context, or in the
        # batcher's queue) when either comes is not run (DeadlineExceeded: 504; Cancelled: the
        # client is gone, nothing is sent).
        if isinstance(self.admission, Passage):
            result = await self.admission.run_async(partial(self.engine.run, call, deadline, client, source),
                                                    deadline)
        else:
            cancelled = threading.Event()
            engine_call = partial(call, self.engine, deadline=deadline, cancelled=cancelled)
            result = await self.admission.run(engine_call, deadline, cancelled, client, source)
        self.metrics.observe_result(self.name, result, self.signature.task)
        return result

    def close(self) -> None:
        self.admission.shutdown()
        self.engine.close()
