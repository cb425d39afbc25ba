"""The engine a caller (server, CLI, bench) holds: its interface and what it describes.

`Engine` is the interface: `score(texts)` or `beam(text)`, thread-safe; runtime/local_engine.py
implements it over a loaded program, server/deploy/replica_engine.py over worker processes. A call may
carry a deadline (`time.monotonic()` seconds) and a `cancelled` event (runtime/waiting.py): a
request still waiting inside the engine when either fires is not run, and the call raises
`boundgen.errors.DeadlineExceeded` or `Cancelled`. A request already running is never interrupted.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec, ScoreSpec, spec_from_dict, spec_to_dict
from boundgen.errors import WrongTask
from boundgen.runtime.results import BeamResult, ScoreResult


@dataclass(frozen=True)
class Provenance:
    """Where a compiled engine's program came from (its artifact's manifest) and how it was loaded."""

    artifact_dir: str
    lowering: dict  # op -> implementation
    weights: str  # "external" | "packaged"
    gpu_name: str | None
    validation_passed: bool | None
    boundgen: str  # the version that loaded it
    tokenizer: str  # the text encoder in use (text/tokenizer.py)


@dataclass(frozen=True)
class EngineSpec:
    """What a client may send and will get back, and how the engine serves it: the model's name,
    its program's bounds (artifact/program.py; its task is `task_of(spec)`, artifact/tasks.py),
    the runtime settings it runs with, and load-time facts. The server's model metadata, input
    checks, admission bound and model config come from here."""

    name: str
    program: ScoreSpec | BeamSpec
    device: str = "cpu"
    dtype: str = "float32"
    # The settings in effect: the manifest's with the load's overrides, cuda_graphs and batching
    # as they took effect (no graphs off CUDA, no batching where a call holds one request).
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    concurrency: int = 1  # requests the engine works on at once (the server's default in-flight bound)
    vocab_outputs: bool = False  # the program returns lse and label_logits (artifact/tensors.py)
    fp8_groups: tuple[str, ...] = ()  # linear groups in FP8 (counted at the FP8 peak, bench/mfu.py)
    max_token_bytes: int | None = None  # longest token in bytes, if not the Qwen vocabulary's (server/signature.py)
    provenance: Provenance | None = None  # None: no artifact (an eager engine, workers elsewhere)

    @property
    def task(self) -> str:
        return self.program.task

    def to_dict(self) -> dict:
        """Plain JSON-able form (sent to front-end processes, server/deploy/)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(program=spec_to_dict(self.program), runtime=asdict(self.runtime), fp8_groups=list(self.fp8_groups),
                   provenance=None if self.provenance is None else asdict(self.provenance))
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "EngineSpec":
        raw = dict(raw)
        raw.update(program=spec_from_dict(raw["program"]), runtime=RuntimeConfig(**raw["runtime"]),
                   fp8_groups=tuple(raw["fp8_groups"]),
                   provenance=None if raw["provenance"] is None else Provenance(**raw["provenance"]))
        return cls(**raw)


class Engine:
    spec: EngineSpec

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        raise WrongTask(f"model {self.spec.name} is a {self.spec.task} model, not a score model")

    def score_ids(self, samples: Sequence[Sequence[int]], deadline: float | None = None,
                  cancelled: threading.Event | None = None) -> ScoreResult:
        """`score` of samples given as token ids (no template: the ids are the model's input)."""
        raise WrongTask(f"model {self.spec.name} does not take token ids")

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        raise WrongTask(f"model {self.spec.name} is a {self.spec.task} model, not a beam model")

    def warmup(self) -> None:
        """Run representative requests once so that the first real request pays no lazy cost."""

    def close(self) -> None:
        """Release device memory and threads."""
