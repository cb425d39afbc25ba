"""The engine a caller (server, CLI, bench) holds: one loaded artifact, thread-safe.

`Engine` is the interface; `load_engine(path)` returns the implementation for an artifact
directory. Calls may come from many threads at once: the engine bounds its own concurrency
with a pool of preallocated request contexts and blocks a caller until one is free.

A call may carry a deadline (`time.monotonic()` seconds): a request still waiting inside the
engine (for a context, or in the batcher's queue) when it passes is not run, and the call raises
`boundgen.errors.DeadlineExceeded`. A request already running is never interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from boundgen.runtime.results import BeamResult, ScoreResult


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

    def score(self, texts: Sequence[str], deadline: float | None = None) -> ScoreResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a score model")

    def beam(self, text: str, deadline: float | None = None) -> BeamResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a beam model")

    def warmup(self) -> None:
        """Run representative requests once so that the first real request pays no lazy cost."""

    def close(self) -> None:
        """Release device memory and threads."""


def load_engine(path, **kwargs) -> Engine:
    from boundgen.runtime.loading import load_artifact_engine

    return load_artifact_engine(path, **kwargs)
