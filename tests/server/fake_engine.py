"""A fake Engine for server tests: deterministic outputs computed from the inputs, a settable
compute time, and a log of every call that reached it.

Configured by `fake.json` in a directory that stands in for an artifact:
    {"spec": {"name": ..., "program": {the spec's dict form}}, "sleep_s": 0.0, "log": "/path/calls.jsonl",
     "gate": "/path/file", "workers": null, "load_error": null, "tokenize_s_per_mb": 0.0}
- a text containing `sleep=S` makes its call sleep S seconds instead of `sleep_s`;
- a text containing `hold=PATH` makes its call wait until the file PATH exists (bounded), so
  tests can keep a request running for exactly as long as they need;
- `warmup()` blocks until the file `gate` exists (bounded), so tests can hold a server in "loading";
- `workers: N` runs at most N calls at once, as a real engine with N contexts (or one batching
  worker) does: a call waits for a free worker, and a call given a deadline that passes, or a
  `cancelled` event that is set, while it waits is not run (DeadlineExceeded / Cancelled, as
  runtime/batcher.py raises them); the log records when a call starts to
  wait, when it starts to run, and when one is refused (`read_events`);
- "tokens" are whitespace-separated words; the limits and messages mirror the real tokenizer's;
  `tokenize_s_per_mb` makes counting them cost that many seconds per MB of text, on the calling
  thread, as a real tokenizer's time grows with the text;
- `load_error: "..."` makes loading the artifact fail with ArtifactError (as a corrupted one does);
- loading logs `{"event": "loaded", "runtime": {...}}` with the RuntimeConfig overrides it was given;
- every record has the `pid` of the process the engine runs in (which replica served a request).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path

import numpy as np

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import spec_from_dict, spec_to_dict
from boundgen.errors import ArtifactError, Cancelled, DeadlineExceeded, InvalidInput
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.waiting import wait_slice
from boundgen.runtime.results import BeamResult, ScoreResult

SLEEP = re.compile(r"sleep=([0-9.]+)")
HOLD = re.compile(r"hold=(\S+)")
HOLD_LIMIT_S = 60.0


def _h(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def write_fake_artifact(directory: Path, spec: EngineSpec, sleep_s: float = 0.0, log: Path | None = None,
                        gate: Path | None = None, workers: int | None = None, load_error: str | None = None,
                        tokenize_s_per_mb: float = 0.0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"spec": {"name": spec.name, "program": spec_to_dict(spec.program)}, "sleep_s": sleep_s,
              "log": str(log) if log else None, "gate": str(gate) if gate else None, "workers": workers,
              "load_error": load_error, "tokenize_s_per_mb": tokenize_s_per_mb}
    (directory / "fake.json").write_text(json.dumps(config))
    return directory


class FakeEngine(Engine):
    def __init__(self, spec: EngineSpec, sleep_s: float = 0.0, log: str | None = None, gate: str | None = None,
                 workers: int | None = None, tokenize_s_per_mb: float = 0.0):
        self.spec, self.sleep_s, self.log, self.gate = spec, sleep_s, log, gate
        self.tokenize_s_per_mb = tokenize_s_per_mb
        self._lock = threading.Lock()
        self._workers = threading.Semaphore(workers) if workers else None

    @classmethod
    def from_dir(cls, path, **runtime) -> "FakeEngine":
        """`runtime`: boundgen.load's RuntimeConfig overrides (serve's --contexts, ...): recorded in
        the spec's runtime (so `contexts` is the engine's concurrency, as a real engine's) and logged."""
        config = json.loads((Path(path) / "fake.json").read_text())
        if config.get("load_error"):
            raise ArtifactError(config["load_error"])
        spec = EngineSpec(config["spec"]["name"], spec_from_dict(config["spec"]["program"]),
                          runtime=RuntimeConfig().replace(**runtime), concurrency=runtime.get("contexts") or 1)
        engine = cls(spec, config["sleep_s"], config["log"], config["gate"], config.get("workers"),
                     config.get("tokenize_s_per_mb", 0.0))
        engine._write({"event": "loaded", "model": spec.name, "runtime": runtime})
        return engine

    # ---- Engine -------------------------------------------------------------------------

    def score(self, texts, deadline=None, cancelled=None):
        if self.spec.task != "score":
            return super().score(texts, deadline, cancelled)
        self._check(texts)
        start = self._compute(texts, deadline, cancelled)
        logits = np.array([[(_h(t) >> (4 * j)) % 97 / 10.0 for j in range(len(self.spec.program.label_token_ids))]
                           for t in texts], dtype=np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
        self._record(texts, start)
        # Token counts (words), and no vocabulary log-probabilities: as an artifact built before them.
        return ScoreResult(probs, list(self.spec.program.label_token_ids), self._timings(texts, start),
                           num_tokens=np.array([len(t.split()) for t in texts], dtype=np.int64))

    def beam(self, text, deadline=None, cancelled=None):
        if self.spec.task != "beam":
            return super().beam(text, deadline, cancelled)
        self._check([text])
        start = self._compute([text], deadline, cancelled)
        w, n, h = self.spec.program.width, self.spec.program.steps, _h(text)
        ids = ((h + 31 * np.arange(w)[:, None] + 7 * np.arange(n)[None, :]) % 1000).astype(np.int32)
        scores = (-0.5 * np.arange(w) - (h % 10) / 10.0).astype(np.float32)
        texts = [f"{text[:6]}→{i}" for i in range(w)]
        self._record([text], start)
        return BeamResult(ids, scores, np.zeros(w, dtype=bool), texts, self._timings([text], start))

    def warmup(self) -> None:
        if self.gate:
            _wait_for_file(self.gate)

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _timings(texts, start: float) -> dict:
        """As a real engine reports them: seconds per stage, and the counts `batch_requests` (one
        request per call here) and `input_tokens` (words)."""
        return {"pre": 0.0, "model": time.monotonic() - start, "batch_requests": 1,
                "input_tokens": sum(len(t.split()) for t in texts)}

    def _check(self, texts) -> None:
        limit = self.spec.program.max_tokens_per_sample
        if self.tokenize_s_per_mb:
            time.sleep(self.tokenize_s_per_mb * sum(len(t.encode()) for t in texts) / 1e6)
        for i, text in enumerate(texts):
            if not text.strip():
                raise InvalidInput(f"sample {i} is empty or whitespace only; every text needs content")
            n = len(text.split())
            if n > limit:
                raise InvalidInput(f"sample {i} has {n} tokens, more than the limit of {limit} tokens per sample")

    def _compute(self, texts, deadline: float | None, cancelled: threading.Event | None) -> float:
        try:
            self._enter(texts, deadline, cancelled)
        except (DeadlineExceeded, Cancelled) as exc:
            self._write({"texts": list(texts), "event": "refused", "error": type(exc).__name__})
            raise
        try:
            start = time.monotonic()
            self._write({"texts": list(texts), "event": "started"})
            asked = [float(m.group(1)) for t in texts for m in SLEEP.finditer(t)]
            seconds = max(asked) if asked else self.sleep_s
            if seconds:
                time.sleep(seconds)
            for path in [m.group(1) for t in texts for m in HOLD.finditer(t)]:
                _wait_for_file(path)
            return start
        finally:
            if self._workers is not None:
                self._workers.release()

    def _enter(self, texts, deadline: float | None, cancelled: threading.Event | None) -> None:
        """Wait for a free worker (if bounded), at most until the deadline and while not
        cancelled (looked at every CANCEL_POLL_S, as the real engines do); else do not run."""
        self._refuse(time.monotonic(), deadline, cancelled, waiting=False)
        if self._workers is None or self._workers.acquire(blocking=False):
            return
        self._write({"texts": list(texts), "event": "waiting"})
        while True:
            now = time.monotonic()
            self._refuse(now, deadline, cancelled, waiting=True)
            if self._workers.acquire(timeout=wait_slice(now, deadline, cancelled)):
                return

    def _refuse(self, now: float, deadline: float | None, cancelled: threading.Event | None, waiting: bool) -> None:
        """As runtime/waiting.refusal: a deadline that has passed wins over a cancellation."""
        if deadline is not None and now >= deadline:
            if waiting:
                raise DeadlineExceeded(f"fake engine: the deadline passed waiting for a worker of model "
                                       f"{self.spec.name}; the request was not run")
            raise DeadlineExceeded(f"fake engine: the deadline had passed before model {self.spec.name} "
                                   "could start; the request was not run")
        if cancelled is not None and cancelled.is_set():
            where = f"waiting for a worker of model {self.spec.name}" if waiting else "before it could start"
            raise Cancelled(f"fake engine: the request was cancelled {where}; it was not run")

    def _record(self, texts, start: float) -> None:
        self._write({"texts": list(texts), "start": start, "end": time.monotonic()})

    def _write(self, record: dict) -> None:
        if self.log:
            with self._lock, open(self.log, "a") as f:
                f.write(json.dumps({**record, "pid": os.getpid()}) + "\n")


def _wait_for_file(path: str) -> None:
    end = time.monotonic() + HOLD_LIMIT_S
    while not Path(path).exists():
        if time.monotonic() > end:
            raise RuntimeError(f"fake engine: file {path} never appeared")
        time.sleep(0.01)


def read_log(path: Path) -> list[dict]:
    """The calls a fake engine completed (one dict per call: texts, start, end in monotonic seconds)."""
    return [record for record in _records(path) if "event" not in record]


def read_events(path: Path, event: str) -> list[dict]:
    """The calls that started to wait for a worker (`event` "waiting"), or that were refused
    without running ("refused"; `error`: the exception's class name)."""
    return [record for record in _records(path) if record.get("event") == event]


def wait_for_event(path: Path, text: str, event: str, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until the log at `path` holds `event` ("started", "waiting", "refused") for a call with `text`."""
    end = time.monotonic() + timeout_s
    while not any(text in record["texts"] for record in read_events(path, event)):
        if time.monotonic() > end:
            raise AssertionError(f"the fake engine never logged {event!r} for {text!r}")
        time.sleep(0.01)


def _records(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]
