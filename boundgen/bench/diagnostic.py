"""The seed's framework-overhead diagnostic: one fixed 1,024-token score request (4 samples x 256
tokens), sequentially, through the full engine (`engine.score(texts)`: tokenise, pack, the
program, build results) and through the compiled program alone, on inputs prepared once.
The seed saw ~1% difference.

The one adapter is `program_alone`: an engine offers `engine.program_call(texts)` returning a
zero-argument callable that runs its compiled program once on the packed inputs of `texts`
(prepared once by its own pre-processing, on a context of its own) and returns after the device
has finished (runtime/local_engine.py).
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


def program_alone(engine, texts: Sequence[str]) -> Callable[[], object]:
    """A zero-argument callable running the engine's program alone on `texts`, prepared once."""
    program_call = getattr(engine, "program_call", None)
    if not callable(program_call):
        raise NotImplementedError(f"{type(engine).__name__} has no program_call(texts): the diagnostic cannot reach "
                                  "its program")
    return program_call(list(texts))


def _mean_ms(fn: Callable, iterations: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - t0) / iterations * 1e3


def run_diagnostic(engine, request: Request, *, iterations: int = 100, warmup: int = 10) -> dict:
    """Mean ms per request, engine vs program alone; both loops interleaved twice so drift shows as spread."""
    texts = list(request.texts)
    program = program_alone(engine, texts)
    engine_ms, program_ms = [], []
    for _ in range(2):
        engine_ms.append(_mean_ms(lambda: engine.score(texts), iterations, warmup))
        program_ms.append(_mean_ms(program, iterations, warmup))
    e, n = float(np.mean(engine_ms)), float(np.mean(program_ms))
    # "node_*": the program alone, under the key names recorded results already use
    return {"tokens": request.tokens, "samples": request.samples, "iterations": 2 * iterations,
            "engine_ms": e, "node_ms": n, "engine_qps": 1e3 / e, "node_qps": 1e3 / n,
            "overhead_pct": 100.0 * (e / n - 1.0), "runs_engine_ms": engine_ms, "runs_node_ms": program_ms,
            "note": "concurrency 1, no RPC"}
