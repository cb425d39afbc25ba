"""The engine a caller (server, CLI, bench) holds: its interface and what it describes.

`Engine` is the interface: `score(texts)` or `beam(text)`, thread-safe; runtime/local_engine.py
implements it over a loaded program, server/deploy/replica_engine.py over worker processes. A call may
carry a deadline (`time.monotonic()` seconds) and a `cancelled` event (runtime/waiting.py): a
request still waiting inside the engine when either fires is not run, and the call raises
`boundgen.errors.DeadlineExceeded` or `Cancelled`. A request already running is never interrupted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.runtime.results import BeamResult, ScoreResult


@dataclass(frozen=True)
class EngineSpec:
    """What a client may send and will get back: the model's name and its program's bounds
    (artifact/program.py); the server's model metadata and input checks come from here."""

    name: str
    program: ScoreSpec | BeamSpec
    device: str = "cpu"
    dtype: str = "float32"
    extra: dict = field(default_factory=dict)  # load-time facts: contexts, concurrency, lowering, ...

    @property
    def task(self) -> str:
        return self.program.task


class Engine:
    spec: EngineSpec

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a score model")

    def score_ids(self, samples: Sequence[Sequence[int]], deadline: float | None = None,
                  cancelled: threading.Event | None = None) -> ScoreResult:
        """`score` of samples given as token ids (no template: the ids are the model's input)."""
        raise NotImplementedError(f"model {self.spec.name} does not take token ids")

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        raise NotImplementedError(f"model {self.spec.name} is a {self.spec.task} model, not a beam model")

    def warmup(self) -> None:
        """Run representative requests once so that the first real request pays no lazy cost."""

    def close(self) -> None:
        """Release device memory and threads."""
