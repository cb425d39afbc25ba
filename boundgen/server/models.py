"""The models a server holds and its lifecycle state; the part of the request path that HTTP
and gRPC share: model lookup, deadlines, per-request metrics.

State: loading -> ready -> draining. Only `ready` admits requests; `draining` (after SIGTERM)
answers new ones 503 / UNAVAILABLE while already admitted ones finish.

A served model can be replaced while ready (`swap`, then `retire`: repository.py's rolling
replace): the old one stops admitting and finishes what it admitted, off the name's table.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from boundgen.artifact.tasks import task_named, task_of
from boundgen.errors import ConfigError, InvalidInput, shown
from boundgen.runtime.engine import Engine
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.server.config import ServerConfig
from boundgen.server.metrics import ServerMetrics
from boundgen.server.served import VERSION, ServedModel
from boundgen.server.signature import EngineCall
from boundgen.server.status import Unavailable, status_of

LOADING, READY, DRAINING = "loading", "ready", "draining"
MAX_TIMEOUT_US = (1 << 63) - 1  # the gRPC int64_param's range; HTTP JSON integers are unbounded


@dataclass
class Observed:
    """The request ModelSet.observe counts: `name`, its model, once known."""
    name: str = ""


class ModelSet:
    def __init__(self, config: ServerConfig, metrics: ServerMetrics):
        self.config, self.metrics = config, metrics
        self.models: dict[str, ServedModel] = {}
        self.retiring: list[ServedModel] = []  # replaced, finishing what they admitted (swap / retire)
        self.state = LOADING

    # ---- lifecycle ------------------------------------------------------------------------

    def add(self, engine: Engine, source: str = "") -> ServedModel:
        """Serve `engine`, loaded from the artifact directory `source`."""
        name = engine.spec.name
        if name in self.models:
            raise ConfigError(f"two artifacts are both named {name!r}; rebuild one with --name")
        model = self._served(engine, source)
        self.models[name] = model
        return model

    def _served(self, engine: Engine, source: str) -> ServedModel:
        return ServedModel(engine, self.metrics, self.config.max_inflight, self.config.max_queue, source,
                           self.config.refusal_hold_ms / 1e3)

    def swap(self, engine: Engine, source: str = "") -> tuple[ServedModel, ServedModel | None]:
        """Serve `engine` under its name from now on, in place of the model served under that name,
        if any: returned with its admission closed (what it admitted still finishes on it); `retire` it."""
        name = engine.spec.name
        old = self.models.get(name)
        model = self._served(engine, source)
        self.models[name] = model
        if old is not None:
            old.admission.close()
            self.retiring.append(old)
        return model, old

    async def retire(self, old: ServedModel, timeout_s: float) -> bool:
        """Wait until a replaced model is idle (at most `timeout_s`), then close it; False if it was not."""
        try:
            await asyncio.wait_for(old.admission.wait_idle(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            if old in self.retiring:  # else close() closed it (the server stopped meanwhile)
                self.retiring.remove(old)
                old.close()

    def set_ready(self) -> None:
        self.state = READY
        self.metrics.ready.set(1)

    def start_draining(self) -> None:
        self.state = DRAINING
        self.metrics.ready.set(0)
        for model in self.models.values():
            model.admission.close()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is running or queued; False if `timeout_s` passed first."""
        waits = [m.admission.wait_idle() for m in [*self.models.values(), *self.retiring]]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def close(self) -> None:
        for model in [*self.models.values(), *self.retiring]:
            model.close()
        self.retiring.clear()

    @property
    def ready(self) -> bool:
        return self.state == READY

    # ---- requests -------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ServedModel:
        """The model a request names; 400 for an unknown one, 503 unless the server is ready."""
        if self.state == LOADING:
            raise Unavailable("the server is still loading its models")
        model = self.models.get(name)
        if model is None:
            raise InvalidInput(f"unknown model {shown(name)}; this server serves: {self._names()}")
        if version not in ("", VERSION):
            raise InvalidInput(f"model {name} has only version {VERSION}, not {shown(version)}")
        return model

    def pick(self, requested: str | None, task: str, route: str) -> str:
        """The model a route of one task runs (/v1/score, /v1/beam): the one named, else the server's
        only model of that task; 400 naming the problem otherwise."""
        of_task = sorted(name for name, m in self.models.items() if task_of(m.engine.spec) is task_named(task))
        if requested is not None and requested in self.models:
            if requested not in of_task:
                raise InvalidInput(f"model {requested} is a {self.models[requested].engine.spec.task} model; "
                                   f"{route} needs a {task} model")
            return requested
        if requested is None and len(of_task) == 1:
            return of_task[0]
        if not of_task:
            raise InvalidInput(f"{route} needs a {task} model, and this server holds none (its models: "
                               f"{self._names()})")
        if requested is None:
            raise InvalidInput(f"name the model: this server holds {task} models {', '.join(of_task)}")
        raise InvalidInput(f"unknown model {shown(requested)}; {task} models here: {', '.join(of_task)}")

    def _names(self) -> str:
        """The models this server holds, for a message: "a, b", or "none"."""
        return ", ".join(sorted(self.models)) or "none"

    def deadline(self, arrived: float, timeout_us: Any = None, remaining_s: float | None = None) -> float:
        """A request's deadline (monotonic seconds): the tightest of its `timeout` parameter
        (microseconds, as Triton; 0 means none), its gRPC deadline, else the server default."""
        budgets = []
        if timeout_us is not None:
            if not isinstance(timeout_us, int) or isinstance(timeout_us, bool) or not 0 <= timeout_us <= MAX_TIMEOUT_US:
                shown = timeout_us if len(repr(timeout_us)) <= 40 else f"{repr(timeout_us)[:20]}... ({len(repr(timeout_us))} digits)"
                raise InvalidInput(f"parameter 'timeout' must be an integer from 0 to {MAX_TIMEOUT_US} (microseconds, "
                                   f"an int64 as in gRPC), got {shown}")
            if timeout_us > 0:
                budgets.append(timeout_us / 1e6)
        if remaining_s is not None:
            budgets.append(remaining_s)
        if not budgets:
            budgets.append(self.config.default_timeout_ms / 1e3)
        return arrived + min(budgets)

    def admitting(self, name: str, version: str = "") -> ServedModel:
        """The model a new request names (`get`), refused with 503 once the server is draining."""
        if self.state == DRAINING:
            raise Unavailable("the server is shutting down and admits no new requests")
        return self.get(name, version)

    async def run(self, name: str, call: EngineCall, deadline: float) -> ScoreResult | BeamResult:
        """Run a checked request on model `name` (served.ServedModel.run): what a JSON route built
        (KServe's tensors take the same path: kserve/inference.py)."""
        return await self.admitting(name).run(call, deadline)

    @contextlib.contextmanager
    def observe(self, protocol: str, name: str = "",
                expired: Callable[[], bool] = lambda: False) -> Iterator["Observed"]:
        """Count one inference request by model and outcome, and time it end to end. A request
        cancelled under us counts as deadline_exceeded if `expired()` (gRPC deadline), else cancelled.
        `name`: its model, or set `.name` on what this yields once the body names it (a request
        refused before that counts under the model label "")."""
        start = time.monotonic()
        seen = Observed(name)
        outcome = "internal_error"
        try:
            yield seen
            outcome = "success"
        except asyncio.CancelledError:
            outcome = "deadline_exceeded" if expired() else "cancelled"
            raise
        except Exception as exc:
            outcome = status_of(exc).outcome
            raise
        finally:
            label = seen.name if seen.name in self.models else ""
            self.metrics.observe_request(label, protocol, outcome, time.monotonic() - start)
