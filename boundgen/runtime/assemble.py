"""Assemble an engine: the static DAG, the request-context pool and the model runner.

One assembly for both paths: the eager engine (runtime/eager.py, model built from a
checkpoint) and a loaded artifact (runtime/loading.py, AOTInductor runner). Only the runner
differs; this module imports no model code.
"""

from __future__ import annotations

import torch

from boundgen.programs.spec import BeamSpec, ScoreSpec
from boundgen.runtime.context import ContextPool, RequestContext
from boundgen.runtime.batched import BatchedBeamEngine, BatchedScoreEngine
from boundgen.runtime.dag import Dag
from boundgen.runtime.engine import EngineSpec
from boundgen.runtime.executor import DagEngine
from boundgen.runtime.graphs import GraphRunner
from boundgen.runtime.nodes import beam_nodes, score_nodes


def engine_spec(name: str, spec, device: str, dtype: str, extra: dict | None = None) -> EngineSpec:
    common = dict(name=name, task=spec.task, max_samples=spec.max_samples,
                  max_tokens_per_sample=spec.max_tokens_per_sample, max_total_tokens=spec.max_total_tokens,
                  device=device, dtype=dtype, extra=dict(extra or {}))
    if isinstance(spec, ScoreSpec):
        return EngineSpec(labels=tuple(spec.labels), label_token_ids=tuple(spec.label_token_ids), **common)
    return EngineSpec(width=spec.width, steps=spec.steps, **common)


def make_dag(spec: ScoreSpec | BeamSpec, tokenizer, runner, executors: int = 1, token_bucket: int = 0) -> Dag:
    """The task's static DAG around a runner (validated on construction)."""
    make = score_nodes if isinstance(spec, ScoreSpec) else beam_nodes
    inputs, nodes, outputs = make(tokenizer, spec, runner, executors, token_bucket)
    return Dag(inputs, nodes, outputs)


def make_dag_engine(name, spec, tokenizer, runner, device: str, dtype: str, contexts: int = 1,
                    executors: int = 1, cuda_graphs: bool = False, token_bucket: int = 256,
                    extra: dict | None = None, batching: bool = False) -> DagEngine:
    """Assemble the static DAG and the context pool around a runner (eager or compiled).

    With `cuda_graphs` on a CUDA device the runner is wrapped in a GraphRunner and score
    batches are padded to multiples of `token_bucket` tokens (runtime/graphs.py); `warmup()`
    captures every padded shape. With `batching`, concurrent requests share model calls
    (runtime/batched.py)."""
    use_graphs = cuda_graphs and device.startswith("cuda")
    if use_graphs:
        runner = GraphRunner(runner)
    is_score = isinstance(spec, ScoreSpec)
    bucket = token_bucket if use_graphs else 0
    dag = make_dag(spec, tokenizer, runner, executors, bucket)
    dev = torch.device(device)
    pool = ContextPool([RequestContext(spec.call_max_tokens, spec.call_max_samples, dev) for _ in range(contexts)])
    warm = [{"texts": ["warm up"]}] if isinstance(spec, ScoreSpec) else [{"text": "warm up"}]
    batched = bool(batching) and (is_score or spec.max_requests > 1)
    extra = {**(extra or {}), "contexts": contexts, "executors": executors, "cuda_graphs": use_graphs,
             "batching": batched}
    # Requests the server should let in at once: one per context, more when they can share calls.
    extra["concurrency"] = contexts * ((8 if is_score else spec.max_requests) if batched else 1)
    args = (engine_spec(name, spec, device, dtype, extra), dag, pool, warm)
    if not batched:
        return DagEngine(*args)
    if is_score:
        return BatchedScoreEngine(*args)
    return BatchedBeamEngine(*args, max_requests=spec.max_requests)
