"""What a program call costs against the requests it holds: does batching pay?

For R = 1, 2, 4, ... up to what one call's bounds allow, R copies of one request run as one
call of the engine's program (`LocalEngine.model_call`, staged once, the device synchronised
after each call; CUDA graphs replayed when the engine captured them), timed over `iterations`
calls after `warmup`. Per-call time that grows sub-linearly in R is what makes batching pay.
GPU time only: no tokenizing, no RPC, no queueing.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence


def call_curve(engine, texts: Sequence[str], requests: Sequence[int] = (1, 2, 4, 8, 16), iterations: int = 20,
               warmup: int = 3) -> list[dict]:
    """[{requests, call_ms (median), request_ms, speedup (vs R x the one-request call)}] for each R
    that fits one call; R past the bounds are left out."""
    rows = []
    for r in requests:
        try:
            call = engine.model_call(list(texts), copies=r)
        except ValueError:
            break
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        ms = statistics.median(times)
        rows.append({"requests": r, "call_ms": ms, "request_ms": ms / r})
    for row in rows:
        row["speedup"] = rows[0]["call_ms"] * row["requests"] / row["call_ms"]
    return rows


def markdown(rows: list[dict], title: str) -> str:
    lines = [f"{title}", "", "| requests per call | ms per call | ms per request | vs one call each |",
             "|---|---|---|---|"]
    lines += [f"| {r['requests']} | {r['call_ms']:.2f} | {r['request_ms']:.2f} | {r['speedup']:.2f}x |" for r in rows]
    return "\n".join(lines)
