"""Model control through Triton's repository API: load replaces a served model without a restart.

    boundgen serve ART... --model-repository DIR
    HTTP POST /v2/repository/models/{m}/load     gRPC RepositoryModelLoad       load(m)
    HTTP POST /v2/repository/models/{m}/unload   gRPC RepositoryModelUnload     refused

Which directories may be loaded: only DIR/m, a child of the directory given with
--model-repository, named by the request's model name m (letters, digits, '.', '_', '-', not
starting with '.'; no path separators), and the artifact there must be named m. Nothing else on
disk is reachable through the API. Without --model-repository, load is refused as before
(NotSupported: HTTP 400, gRPC UNAVAILABLE, as Triton refuses it without model control).
Artifacts loaded this way go through the same engine factory as those given on the command line,
so `--trust-key` checks their signature and serve's runtime flags apply.

load(m), one at a time (a second waits for the first):

    engine = factory(DIR/m); engine.warmup()        on a loader thread; the served m keeps serving
    ModelSet.swap(engine)                           new requests go to the new engine; the old
                                                    one's admission closes (requests it admitted,
                                                    running or queued, finish on the old engine)
    ModelSet.retire(old)                            wait until the old one is idle (at most
                                                    --drain-timeout-s), then close its engine

A request is never dropped by a replace: every request takes its model from the ModelSet and
enters that model's admission in one step of the event loop (ModelSet.admitting, then
ServedModel.run: kserve/inference.py, ModelSet.run), so it is either admitted by the old model
before the switch, and run there, or sees the new one. m not served yet is added the same way
(no old one to retire). A load that fails (no such directory, a bad
artifact, a name that is not m, a failing warm-up) answers 400 with the reason and leaves the
served model as it was. The load answers once the old engine is closed.

Unload is refused: removing a model is a restart without it; a new version replaces an old one
through load. A load request's parameters (Triton's `config` and `file:` overrides) are refused:
the artifact is the directory's.

Catalogues: load(m) with the one parameter `{"catalogue": "c"}` replaces the catalogue of m, a
constrained beam model, with DIR/c (a catalogue directory, `boundgen catalogue build --out
DIR/c`; the same naming policy), without reloading the model: it is read and checked on a loader
thread while m keeps serving, then swapped in as one reference (runtime/catalogue.py), so each
request runs on the old catalogue or the new one, whole, and none is dropped. A catalogue that
does not fit m answers 400 and leaves the served one in place; while the server drains, 503. A later
load(m) of the model keeps the catalogue loaded last (the engine factory would bring back the one
given at start, `serve --catalogue`); if that catalogue does not fit the new artifact, the model
serves its start catalogue and the log says so.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

from boundgen.artifact.manifest import MANIFEST_FILE, MODEL_NAME
from boundgen.errors import BoundgenError, InvalidInput, shown
from boundgen.runtime.engine import Engine
from boundgen.server.models import READY, ModelSet
from boundgen.server.status import ServeError, Unavailable



class NotSupported(ServeError):
    """A repository request boundgen refuses (load without --model-repository, unload)."""

    outcome = "not_supported"


class Repository:
    def __init__(self, models: ModelSet, root: Path, load_engine: Callable[[Path], Awaitable[Engine]],
                 drain_timeout_s: float, say: Callable[[str], None]):
        """load_engine(path): a loaded and warmed-up engine, built off the event loop (app.py)."""
        self.models, self.root, self.load_engine = models, Path(root), load_engine
        self.drain_timeout_s, self.say = drain_timeout_s, say
        self._lock = asyncio.Lock()
        self.catalogues: dict[str, Path] = {}  # model -> the catalogue a load gave it last

    async def load(self, name: str) -> None:
        """Load DIR/name, replacing the served name (the module docstring's steps). The load runs to
        its end even if its requester goes away (a disconnected client, a gRPC deadline): cancelled
        halfway, it would leave a loaded engine unserved, or close the old one under its requests."""
        path = self.artifact_dir(name)
        task = asyncio.ensure_future(self._load(name, path))
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _load(self, name: str, path: Path) -> None:
        async with self._lock:
            if self.models.state != READY:
                raise Unavailable(f"cannot load {name} now: the server is {self.models.state}")
            self.say(f"boundgen serve: loading {name} from {path}")
            try:
                engine = await self.load_engine(path)
            except BoundgenError as exc:
                raise InvalidInput(f"failed to load model {name} from the model repository: {exc}") from None
            if engine.spec.name != name:
                engine.close()
                raise InvalidInput(f"the artifact in the model repository's directory {name!r} is named "
                                   f"{engine.spec.name!r}; rebuild it with --name {name} or rename the directory")
            await self._keep_catalogue(name, engine)
            if self.models.state != READY:  # SIGTERM came while it loaded: serve nothing new
                engine.close()
                raise Unavailable(f"cannot load {name} now: the server is {self.models.state}")
            model, old = self.models.swap(engine, str(path))
            self.say(f"boundgen serve: model {name} ({engine.spec.task}) loaded and warmed up"
                     f"{', replacing the one served' if old else ''}, max in flight {model.admission.max_inflight}, "
                     f"queue {model.admission.max_queue}")
            if old is not None:
                if not await self.models.retire(old, self.drain_timeout_s):
                    self.say(f"boundgen serve: the replaced {name} still ran requests after "
                             f"{self.drain_timeout_s} s; closed anyway")
                self.say(f"boundgen serve: the replaced {name} drained and closed")

    async def load_catalogue(self, name: str, catalogue) -> None:
        """Replace the catalogue of served model `name` with DIR/catalogue (module docstring)."""
        if not isinstance(catalogue, str):
            raise InvalidInput("the load parameter catalogue names a catalogue directory of the model repository")
        path = self.artifact_dir(catalogue, "a catalogue built with --out DIR/" + catalogue)
        engine = self.models.get(name).engine
        if not hasattr(engine, "load_catalogue"):
            raise InvalidInput(f"model {name} takes no catalogue")
        async with self._lock:
            if self.models.state != READY:  # draining: what is queued finishes on the catalogue it came to
                raise Unavailable(f"cannot load a catalogue for {name} now: the server is {self.models.state}")
            self.say(f"boundgen serve: loading catalogue {catalogue} for {name}")
            try:
                await asyncio.to_thread(engine.load_catalogue, path)
            except BoundgenError as exc:
                raise InvalidInput(f"failed to load catalogue {catalogue} for model {name}: {exc}") from None
            self.catalogues[name] = path
            self.say(f"boundgen serve: model {name} serves catalogue {catalogue}")

    async def _keep_catalogue(self, name: str, engine: Engine) -> None:
        """A model loaded again keeps the catalogue a load gave it, where that fits the new artifact."""
        path = self.catalogues.get(name)
        if path is None or not hasattr(engine, "load_catalogue"):
            return
        try:
            await asyncio.to_thread(engine.load_catalogue, path)
        except BoundgenError as exc:
            del self.catalogues[name]
            self.say(f"boundgen serve: catalogue {path.name} does not fit the new {name} ({exc}); it serves the "
                     "catalogue it was started with")
            return
        self.say(f"boundgen serve: the new {name} keeps catalogue {path.name}")

    def loadable(self) -> list[str]:
        """The names a load may name: children of DIR that hold an artifact manifest (not read here:
        a load checks it), by the policy above."""
        try:
            return sorted(p.name for p in self.root.iterdir()
                          if MODEL_NAME.fullmatch(p.name) and (p / MANIFEST_FILE).is_file())
        except OSError:  # DIR gone or unreadable since serve checked it: nothing to offer
            return []

    def artifact_dir(self, name: str, what: str | None = None) -> Path:
        """DIR/name, for a plain child name only (the policy above); `what` the directory should hold."""
        if not MODEL_NAME.fullmatch(name):
            raise InvalidInput(f"model name {shown(name)} cannot name a directory of the model repository: use "
                               "letters, digits, '.', '_' and '-', not starting with '.'")
        path = self.root / name
        try:
            found = path.is_dir()
        except OSError as exc:  # a name too long for the file system, no permission
            raise InvalidInput(f"the model repository's directory {shown(name)} cannot be read: "
                               f"{exc.strerror or exc}") from None
        if not found:
            raise InvalidInput(f"the model repository has no directory {shown(name)} "
                               f"({what or 'an artifact built with --name ' + shown(name)})")
        return path


def _retrieve(task: asyncio.Task) -> None:
    """Mark a load's failure as seen: its requester, if still there, answers and logs it (frontends)."""
    if not task.cancelled():
        task.exception()


async def control(models: ModelSet, repository: Repository | None, action: str, name: str,
                  parameters: dict[str, Any] | None = None) -> None:
    """One repository request: load (a rolling replace) or unload (refused)."""
    if action == "unload":
        raise NotSupported(f"model repository unload (of {name or 'a model'}) is not supported: a new version "
                           "replaces a served model through load; to stop serving one, restart without it")
    if repository is None:
        raise NotSupported(f"model repository load (of {name or 'a model'}) is not supported: this server was "
                           "started without --model-repository, so it serves only the artifact directories "
                           "given to `boundgen serve`")
    if parameters and set(parameters) == {"catalogue"} and repository is not None:
        await repository.load_catalogue(name, parameters["catalogue"])
        return
    if parameters:
        raise InvalidInput(f"load parameters ({', '.join(sorted(parameters))}) are not supported: the model is "
                           f"the artifact in the model repository's directory {name!r}")
    await repository.load(name)
