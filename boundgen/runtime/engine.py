"""The engine a caller (server, CLI, bench) holds: one loaded artifact, thread-safe.

`Engine` is the interface; `load_engine(path)` returns the implementation for an artifact
directory. Calls may come from many threads at once: the engine bounds its own concurrency
with a pool of preallocated request contexts and blocks a caller until one is free.

A call may carry a deadline (`time.monotonic()` seconds): a request still waiting inside the
engine (for a context, or in the batcher's queue) when it passes is not run, and the call raises
`boundgen.errors.DeadlineExceeded`. It may carry a `cancelled` event too (the server sets it when
the client goes away): a request still waiting when it is set is not run, and the call raises
`boundgen.errors.Cancelled` within about CANCEL_POLL_S. A request already running is never
interrupted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

from boundgen.runtime.results import BeamResult, ScoreResult

# Seconds: how often a caller waiting inside an engine looks at its `cancelled` event (an Event
# cannot wake a thread waiting on something else). Whether a request runs does not depend on it:
# the event is checked again just before a request would run; only the caller's return waits.
CANCEL_POLL_S = 0.05


def refusal(now: float, deadline: float | None, cancelled: threading.Event | None) -> str | None:
    """Why a waiting request must not run any more: "cancelled", "expired", or None (it may)."""
    if cancelled is not None and cancelled.is_set():
        return "cancelled"
    return "expired" if deadline is not None and now >= deadline else None


def wait_slice(now: float, deadline: float | None, cancelled: threading.Event | None) -> float | None:
    """How long (seconds, >= 0) a caller waiting inside an engine may block before it looks at its
    deadline and `cancelled` event again; None: until what it waits for happens."""
    slices = [] if deadline is None else [max(0.0, deadline - now)]
    if cancelled is not None:
        slices.append(CANCEL_POLL_S)
    return min(slices) if slices else None


@dataclass(frozen=True)
class EngineSpec:
    """What a client may send and will get back; the server's model metadata comes from here."""

    name: str
    task: str  # "score" | "beam"
    max_samples: int = 1  # score: samples per request; beam: 1
    max_tokens_per_sample: int = 512  # score: tokens per sample; beam: prompt tokens
    max_total_tokens: int = 512  # score: tokens per request
    labels: tuple[str, ...] = ()  # score: label texts
    label_token_ids: tuple[int, ...] = ()
    width: int = 0  # beam: W
    steps: int = 0  # beam: N_gen
    device: str = "cpu"
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)


class Engine:
    spec: EngineSpec

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a score model")

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a beam model")

    def warmup(self) -> None:
        """Run representative requests once so that the first real request pays no lazy cost."""

    def close(self) -> None:
        """Release device memory and threads."""


def load_engine(path, **kwargs) -> Engine:
    from boundgen.runtime.loading import load_artifact_engine

    return load_artifact_engine(path, **kwargs)
