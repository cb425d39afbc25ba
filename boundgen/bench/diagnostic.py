"""The seed's framework-overhead diagnostic: one fixed 1,024-token score request (4 samples x 256
tokens), sequentially, through the full engine (`engine.score(texts)`: tokenise, pack, model
node, encode results) and through the compiled model node alone, on inputs prepared once.
The seed saw ~1% difference.

The one adapter is `node_call`: an engine may offer `engine.model_node(texts)` returning a
zero-argument callable that runs its compiled model node once on the packed inputs of `texts`
(prepared once by its own pre-processing) and returns after the device has finished; a
`DagEngine` without it is reached through its DAG and context pool. Run it sequentially only:
the node reuses one context's buffers, which `engine.score` may also use between calls (with
the same texts, so the same data).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from boundgen.bench.workloads import Request, TokenCodec, exact_text, word_vocabulary

SAMPLES, TOKENS_PER_SAMPLE = 4, 256


def fixed_request(tokenizer, seed: int = 1024) -> Request:
    codec = TokenCodec(tokenizer)
    vocab = word_vocabulary(codec)
    rng = np.random.default_rng(seed)
    texts = tuple(exact_text(codec, vocab, TOKENS_PER_SAMPLE, rng) for _ in range(SAMPLES))
    return Request(0, texts, (TOKENS_PER_SAMPLE,) * SAMPLES)


def node_call(engine, texts: Sequence[str]) -> Callable[[], object]:
    """A zero-argument callable running the engine's model node alone on `texts`, prepared once.

    `engine.model_node(texts)` when the engine offers it; otherwise, for a `DagEngine` (`dag`,
    `pool`): the DAG's nodes before the model node run once on one context, then each call runs
    the model node on that context's staged inputs and waits for its stream.
    """
    model_node = getattr(engine, "model_node", None)
    if callable(model_node):
        return model_node(list(texts))
    dag, pool = getattr(engine, "dag", None), getattr(engine, "pool", None)
    if dag is None or pool is None:
        raise NotImplementedError(f"{type(engine).__name__} has neither model_node(texts) nor a dag and context "
                                  "pool: the diagnostic cannot reach its model node")
    model = next(node for node in dag.nodes if node.spec.kind == "model")
    ctx = pool.acquire()
    try:
        values = {dag.graph_inputs[0]: list(texts)}
        for node in dag.nodes[: dag.nodes.index(model)]:
            values.update(node.run(ctx, **{name: values[name] for name in node.spec.inputs}))
    finally:
        pool.release(ctx)
    inputs = {name: values[name] for name in model.spec.inputs}
    stream = getattr(ctx, "stream", None)

    def call():
        out = model.run(ctx, **inputs)
        if stream is not None:
            stream.synchronize()
        return out

    return call


def _mean_ms(fn: Callable, iterations: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - t0) / iterations * 1e3


def run_diagnostic(engine, request: Request, *, iterations: int = 100, warmup: int = 10) -> dict:
    """Mean ms per request, engine vs node; both loops interleaved twice so drift shows as spread."""
    texts = list(request.texts)
    node = node_call(engine, texts)
    engine_ms, node_ms = [], []
    for _ in range(2):
        engine_ms.append(_mean_ms(lambda: engine.score(texts), iterations, warmup))
        node_ms.append(_mean_ms(node, iterations, warmup))
    e, n = float(np.mean(engine_ms)), float(np.mean(node_ms))
    return {"tokens": request.tokens, "samples": request.samples, "iterations": 2 * iterations,
            "engine_ms": e, "node_ms": n, "engine_qps": 1e3 / e, "node_qps": 1e3 / n,
            "overhead_pct": 100.0 * (e / n - 1.0), "runs_engine_ms": engine_ms, "runs_node_ms": node_ms,
            "note": "concurrency 1, no RPC"}
