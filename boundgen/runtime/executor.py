"""`DagEngine`: the Engine implementation. A DAG, a pool of request contexts, per-node timings.

A request with a deadline waits for a context at most until the deadline, and is checked once
more after it got one (just before it runs): past its deadline it is not run (DeadlineExceeded).
A request with a `cancelled` event is checked the same way, and looks at its event every
CANCEL_POLL_S (engine.py) while it waits: once the event is set it is not run (Cancelled).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from boundgen.errors import Cancelled, DeadlineExceeded, InvalidInput
from boundgen.runtime.context import ContextPool
from boundgen.runtime.dag import Dag
from boundgen.runtime.engine import Engine, EngineSpec, refusal, wait_slice
from boundgen.runtime.results import BeamResult, ScoreResult

# Which node's time counts as what in a result's timings (seconds).
PHASES = {"tokenize": "pre", "model": "model", "encode_scores": "post", "encode_beams": "post"}


class DagEngine(Engine):
    def __init__(self, spec: EngineSpec, dag: Dag, pool: ContextPool, warmup_inputs: list[dict] = ()):
        self.spec, self.dag, self.pool = spec, dag, pool
        self._warmup_inputs = list(warmup_inputs)

    def _run(self, deadline: float | None = None, cancelled: threading.Event | None = None, **inputs):
        timings: dict[str, float] = {}
        start = time.perf_counter()
        ctx = self._acquire(deadline, cancelled)
        acquired = time.perf_counter()
        try:
            out = self.dag.run(ctx, timings, **inputs)["result"]
        finally:
            self.pool.release(ctx)
        phases = {"context_wait": acquired - start}
        for node, seconds in timings.items():
            key = PHASES.get(node, node)
            phases[key] = phases.get(key, 0.0) + seconds
        phases["total"] = time.perf_counter() - start
        out.timings = phases
        return out

    def _acquire(self, deadline: float | None, cancelled: threading.Event | None):
        """A request context, or DeadlineExceeded / Cancelled if `deadline` passes or `cancelled`
        is set first (then or just after)."""
        start = now = time.monotonic()
        while True:
            self._refuse(start, now, deadline, cancelled)
            ctx = self.pool.acquire(timeout=wait_slice(now, deadline, cancelled))
            now = time.monotonic()
            if ctx is not None:
                break
        try:
            self._refuse(start, now, deadline, cancelled)
        except BaseException:
            self.pool.release(ctx)
            raise
        return ctx

    def _refuse(self, start: float, now: float, deadline: float | None, cancelled: threading.Event | None) -> None:
        """Raise Cancelled or DeadlineExceeded if the request must not run (any more)."""
        waited = f"after {(now - start) * 1e3:.1f} ms waiting for a request context of model {self.spec.name}"
        why = refusal(now, deadline, cancelled)
        if why == "cancelled":
            before = f"before model {self.spec.name} could start" if now == start else waited
            raise Cancelled(f"the request was cancelled {before}; it was not run")
        if why == "expired":
            if now == start:
                raise DeadlineExceeded(f"the deadline passed {(now - deadline) * 1e3:.1f} ms before model "
                                       f"{self.spec.name} could start; the request was not run")
            raise DeadlineExceeded(f"the deadline passed {waited}; the request was not run")

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        if self.spec.task != "score":
            return super().score(texts, deadline, cancelled)
        if isinstance(texts, str):
            raise InvalidInput("score takes a list of texts, got a single string")
        return self._run(deadline, cancelled, texts=list(texts))

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        if self.spec.task != "beam":
            return super().beam(text, deadline, cancelled)
        if not isinstance(text, str):
            raise InvalidInput(f"beam takes one prompt text, got {type(text).__name__}")
        return self._run(deadline, cancelled, text=text)

    def warmup(self) -> None:
        for inputs in self._warmup_inputs:
            self._run(**inputs)
        contexts = [self.pool.acquire() for _ in range(self.pool.size)]
        try:
            self._capture_graphs(contexts)
        finally:
            for ctx in contexts:
                self.pool.release(ctx)

    def _capture_graphs(self, contexts) -> None:
        """Run every padded shape once on every context (runtime/graphs.py), so that all CUDA
        graphs are captured now and never while serving. Nothing to do without graphs."""
        nodes = {n.spec.name: n for n in self.dag.nodes}
        tokenize, model = nodes["tokenize"], nodes["model"]
        batches = tokenize.warm_batches()
        for ctx in contexts:
            for tokens, positions, cu_seqlens in batches:
                model.run(ctx, *ctx.stage(tokens, positions, cu_seqlens))
                if ctx.stream is not None:  # the host buffers are rewritten by the next stage
                    ctx.stream.synchronize()
        self.spec.extra["graph_shapes"] = len(batches)
