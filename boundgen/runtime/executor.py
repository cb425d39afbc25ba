"""`DagEngine`: the Engine implementation. A DAG, a pool of request contexts, per-node timings."""

from __future__ import annotations

import time
from typing import Sequence

from boundgen.errors import InvalidInput
from boundgen.runtime.context import ContextPool
from boundgen.runtime.dag import Dag
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.results import BeamResult, ScoreResult

# Which node's time counts as what in a result's timings (seconds).
PHASES = {"tokenize": "pre", "model": "model", "encode_scores": "post", "encode_beams": "post"}


class DagEngine(Engine):
    def __init__(self, spec: EngineSpec, dag: Dag, pool: ContextPool, warmup_inputs: list[dict] = ()):
        self.spec, self.dag, self.pool = spec, dag, pool
        self._warmup_inputs = list(warmup_inputs)

    def _run(self, **inputs):
        timings: dict[str, float] = {}
        start = time.perf_counter()
        ctx = self.pool.acquire()
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

    def score(self, texts: Sequence[str]) -> ScoreResult:
        if self.spec.task != "score":
            return super().score(texts)
        if isinstance(texts, str):
            raise InvalidInput("score takes a list of texts, got a single string")
        return self._run(texts=list(texts))

    def beam(self, text: str) -> BeamResult:
        if self.spec.task != "beam":
            return super().beam(text)
        if not isinstance(text, str):
            raise InvalidInput(f"beam takes one prompt text, got {type(text).__name__}")
        return self._run(text=text)

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
