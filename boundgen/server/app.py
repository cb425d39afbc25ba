"""Server lifecycle: listen, load, warm up, ready, drain on SIGTERM, exit.

    start()   bind HTTP and gRPC (live at once, ready 503); print the "listening" line
    load()    engine_factory(dir) for each artifact on a loader thread, then engine.warmup();
              only then ready (HTTP 200 / gRPC ready=true)
    drain()   stop admitting (503 / UNAVAILABLE), let running and queued requests finish
              (bounded by config.drain_timeout_s)
    stop()    close listeners, worker threads and engines

With `config.model_repository`, a repository load replaces a served model while ready
(repository.py: load and warm up the new engine, switch, drain and close the old one).

`serve()` runs all of it until SIGTERM or SIGINT and returns the exit code (0 after a drain);
the CLI calls it. `BackgroundServer` runs the same in a thread of the calling process.
Engines come from an injectable factory (default `boundgen.load`) so tests can serve fakes.

This module joins the server's parts (server/__init__.py): the core's ModelSet behind kserve/'s
HTTP and gRPC listeners. It owns that wiring so that the core imports no protocol; deploy/'s
topologies build on its Server.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

import grpc
from aiohttp import web, web_server

import boundgen
from boundgen.errors import BoundgenError
from boundgen.runtime.engine import Engine
from boundgen.server import connections
from boundgen.server import logs
from boundgen.server.config import ServerConfig
from boundgen.server.kserve.grpc_api import GrpcFrontend
from boundgen.server.kserve.http_api import HttpFrontend
from boundgen.server.metrics import ServerMetrics
from boundgen.server.models import ModelSet
from boundgen.server.kserve.repository import Repository
from boundgen.server.kserve.shared_memory import SharedMemory

log = logging.getLogger("boundgen.server")
_HANDLER_CANCELLATION = "handler_cancellation" in inspect.signature(web_server.Server.__init__).parameters

EngineFactory = Callable[[Path], Engine]
LISTENING = "boundgen serve: listening"  # the stdout line launch.py waits for
MAX_INT_DIGITS = 640  # the least Python accepts; a serving process parses no longer integer


def default_engine_factory(artifact_dir: Path, **runtime) -> Engine:
    """`boundgen.load`; `runtime`: RuntimeConfig fields (`boundgen serve`'s flags, generated from
    them) that override the manifest's settings without a rebuild."""
    return boundgen.load(artifact_dir, **runtime)


class Server:
    reuse_port = False  # a front-end process shares its ports with the others (server/deploy/frontend.py)

    def __init__(self, artifact_dirs: Sequence[str | Path], config: ServerConfig,
                 engine_factory: EngineFactory = default_engine_factory, out=sys.stdout):
        if not artifact_dirs:
            raise ValueError("serve needs at least one artifact directory")
        self.artifact_dirs = [Path(d) for d in artifact_dirs]
        self.config, self.engine_factory, self.out = config, engine_factory, out
        self.metrics = ServerMetrics(on_request=logs.access if config.access_log else None)
        self.models = ModelSet(config, self.metrics)
        self.repository = None if config.model_repository is None else Repository(
            self.models, Path(config.model_repository), self._load_engine, config.drain_timeout_s, self.say)
        self.shared_memory = SharedMemory(allowed=config.allow_client_shm)  # one set of regions for both protocols
        self.log_settings = logs.LogSettings(config.log_format, config.log_level)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._http: asyncio.AbstractServer | None = None
        self._say_lock = threading.Lock()
        self._grpc: grpc.aio.Server | None = None

    def say(self, message: str) -> None:
        """One line on `out`, written whole: worker threads say things at once (print() writes the
        text and its newline separately, so two lines could interleave into one); to a pipe without
        waiting for its reader (logs.say)."""
        with self._say_lock:
            logs.say(self.out, logs.status_line(message, self.log_settings.format))

    async def start(self) -> None:
        cfg = self.config
        # Cancel a handler whose client disconnects, so that its queue place frees (aiohttp < 3.9 always did).
        cancel = {"handler_cancellation": True} if _HANDLER_CANCELLATION else {}
        # A compressed body is inflated by http_bodies.read_body, a bounded step at a time (inflation.py);
        # the rest of a refused one is read and dropped as sent, for no longer than a body may take.
        handler_kwargs = {"access_log": None, "keepalive_timeout": cfg.idle_timeout_s, "auto_decompress": False,
                          "lingering_time": cfg.read_timeout_s}
        http = HttpFrontend(self.models, cfg, self.repository, self.shared_memory, self.log_settings)
        self._runner = web.AppRunner(http.app(), **handler_kwargs, **cancel)
        await self._runner.setup()
        try:
            self._http = await connections.listen(self._runner, cfg.host, cfg.http_port, cfg.max_connections,
                                                  handler_kwargs, reuse_port=self.reuse_port,
                                                  unanswered=http.count_unanswered)
        except OSError as exc:
            raise BoundgenError(f"cannot listen for HTTP on {cfg.host}:{cfg.http_port}: {exc.strerror or exc}") from None
        self.http_port = self._http.sockets[0].getsockname()[1]
        frontend = self._grpc_frontend = GrpcFrontend(self.models, cfg, self.repository, self.shared_memory,
                                                      self.log_settings)
        self._grpc = grpc.aio.server(options=frontend.options())
        self._grpc.add_generic_rpc_handlers((frontend.handler(),))
        try:
            self.grpc_port = self._grpc.add_insecure_port(f"{_grpc_host(cfg.host)}:{cfg.grpc_port}")
        except RuntimeError:
            self.grpc_port = 0
        if self.grpc_port == 0:
            raise BoundgenError(f"cannot listen for gRPC on {cfg.host}:{cfg.grpc_port} (port in use?)")
        frontend.port = self.grpc_port
        await self._grpc.start()
        self.say(f"{LISTENING} http={cfg.host}:{self.http_port} grpc={cfg.host}:{self.grpc_port}")

    async def load(self) -> None:
        """Load and warm up every artifact off the event loop, then become ready."""
        for path in self.artifact_dirs:
            self.say(f"boundgen serve: loading {path}")
            engine = await in_daemon_thread(self.engine_factory, path)
            model = self.models.add(engine, str(path))
            await in_daemon_thread(engine.warmup)
            spec = engine.spec
            self.say(f"boundgen serve: model {spec.name} ({spec.task}) loaded and warmed up, "
                     f"max in flight {model.admission.max_inflight}, queue {model.admission.max_queue}")
        self.models.set_ready()
        self.say(f"boundgen serve: ready, models: {', '.join(self.models.models)}")

    async def _load_engine(self, path: Path) -> Engine:
        """A loaded and warmed-up engine, off the event loop (a repository load; closed if warm-up fails)."""
        engine = await in_daemon_thread(self.engine_factory, path)
        try:
            await in_daemon_thread(engine.warmup)
        except BaseException:
            engine.close()
            raise
        return engine

    async def drain(self) -> None:
        self.models.start_draining()
        self.say("boundgen serve: draining (new requests get 503 / UNAVAILABLE)")
        if not await self.models.wait_idle(self.config.drain_timeout_s):
            self.say(f"boundgen serve: requests still running after {self.config.drain_timeout_s} s; stopping anyway")

    async def stop(self) -> None:
        if self._grpc is not None:
            await self._grpc_frontend.intake_settled()  # calls still in gRPC's intake: answered, not cancelled
            await self._grpc.stop(grace=1.0)
        if self._http is not None:
            self._http.close()  # no new connections; cleanup() below closes the open ones
        if self._runner is not None:
            await self._runner.cleanup()
        self.models.close()
        self.shared_memory.close()
        self.say("boundgen serve: stopped")

    async def serve(self, stop: asyncio.Event) -> int:
        """Start, load, serve until `stop` is set, drain, stop. Returns the exit code."""
        await self.start()
        try:
            loading = asyncio.ensure_future(self.load())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if loading.done() and loading.exception() is not None:
                stopping.cancel()
                raise loading.exception()
            if not loading.done():  # asked to stop while loading: nothing admitted yet
                loading.cancel()
                self.models.start_draining()
                return 0
            await stopping
            await self.drain()
            return 0
        finally:
            await self.stop()


# The signals that drain and stop a server: SIGTERM (an orchestrator), SIGINT (Ctrl-C), SIGHUP (its
# terminal closed, a process group's hang-up: before 2026-12-07 it killed the server undrained, and with
# front ends left its socket folder behind).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _grpc_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def in_daemon_thread(fn, *args):
    """Run a blocking call on a daemon thread, so that a stop during a long load does not wait for it."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(error: BaseException | None, result) -> None:
        if not future.done():
            future.set_result(result) if error is None else future.set_exception(error)

    def target():
        # The error is passed as an argument: Python deletes an `except ... as exc` name when the
        # block ends, so a callback that read `exc` later raised NameError and left `future`
        # pending for ever (a load failure then hung the server, live 200 / ready 503).
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, exc, None)
        else:
            loop.call_soon_threadsafe(settle, None, result)

    threading.Thread(target=target, name="boundgen-loader", daemon=True).start()
    return await future


def serve(artifact_dirs: Sequence[str | Path], config: ServerConfig,
          engine_factory: EngineFactory = default_engine_factory) -> int:
    """Run a server in this process until SIGTERM / SIGINT; the exit code (0 after a clean drain)."""
    return serve_until_signal(lambda: (Server(artifact_dirs, config, engine_factory), None), config.log_format,
                              config.log_level)


def serve_until_signal(make_server, log_format: str = "text", log_level: str = "info") -> int:
    """Run `make_server() -> (Server, cleanup or None)` inside an event loop until SIGTERM /
    SIGINT, then `cleanup()`; the exit code. Log records go to stderr in `log_format` (logs.py)."""
    logs.configure(log_format, log_level)
    # A JSON body's integers are converted while it is parsed, before any check sees them: 300 numbers
    # of 4,000 digits cost ~80 ms of the event loop (Python's default allows 4,300). No protocol
    # integer needs more than 20 digits; longer ones make the body invalid JSON (400) at once.
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(MAX_INT_DIGITS)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        server, cleanup = make_server()
        try:
            return await server.serve(stop)
        finally:
            if cleanup is not None:
                cleanup()

    return asyncio.run(main())


class BackgroundServer:
    """A server on its own event loop in a daemon thread of this process (demo, bench, notebooks).

        with BackgroundServer([artifact_dir], ServerConfig(http_port=0, grpc_port=0)) as srv:
            srv.http_url, srv.grpc_url   # "127.0.0.1:PORT" as tritonclient takes them
    """

    def __init__(self, artifact_dirs: Sequence[str | Path], config: ServerConfig,
                 engine_factory: EngineFactory = default_engine_factory, out=sys.stdout):
        self.server = Server(artifact_dirs, config, engine_factory, out)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.exit_code: int | None = None

    @property
    def http_url(self) -> str:
        return f"{self.server.config.host}:{self.server.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.server.config.host}:{self.server.grpc_port}"

    def start(self, timeout_s: float = 600.0) -> "BackgroundServer":
        """Start and return once the models are loaded and warmed up (ready)."""
        self._thread = threading.Thread(target=self._run, name="boundgen-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"the server was not ready within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """Drain and stop; the server's exit code."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.exit_code

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        async def main():
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            watcher = asyncio.ensure_future(self._signal_ready())
            try:
                self.exit_code = await self.server.serve(self._stop)
            finally:
                watcher.cancel()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._started.set()

    async def _signal_ready(self) -> None:
        while not self.server.models.ready:
            await asyncio.sleep(0.01)
        self._started.set()
