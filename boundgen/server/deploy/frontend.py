"""One front-end process of `boundgen serve --frontends N` (started by frontends.py, never by hand).

    python -m boundgen.server.deploy.frontend --link SOCKET --index K --config JSON ARTIFACT_DIR...

It serves every protocol (KServe v2 HTTP and gRPC, the JSON routes, metrics) on the ports the
engine process chose, shared with the other front ends (SO_REUSEPORT: the kernel spreads
connections over them). Its models are LinkedEngines (linked_engine.py): it tokenizes and
encodes results itself and sends token ids to the engine process. It becomes ready once the
engine process says its models are loaded and warmed up; one started while the engine is
already ready (a restart) loads its tokenizers before it listens; SIGTERM drains it like any server;
it exits when the engine process closes the link or dies (the lifeline, replicas.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from boundgen.errors import BoundgenError
from boundgen.server import logs
from boundgen.server.app import Server, in_daemon_thread, serve_until_signal
from boundgen.server.config import ServerConfig
from boundgen.server.deploy.linked_engine import EngineGone, EngineLink, LinkedEngine
from boundgen.server.deploy.replicas import exit_with_parent

ENGINE_GONE_EXIT = 3  # the engine process closed the link


class FrontendServer(Server):
    reuse_port = True

    def __init__(self, artifact_dirs, config: ServerConfig, engine_link: EngineLink, index: int):
        super().__init__(artifact_dirs, config, engine_factory=self._no_loading, out=sys.stderr)
        self.link, self.index = engine_link, index
        # A request changes the one front end it lands on, and the engine process none: refused, said why.
        self.log_settings.fixed = ("each of serve's processes (--frontends) logs on its own; set --log-level and "
                                   "--log-format when starting serve")
        self.metrics.add_constant_labels(frontend=str(index))  # a scrape reaches one front end: which one

    def say(self, message: str) -> None:
        super().say(f"[front end {self.index}] {message}")

    @staticmethod
    def _no_loading(path):
        raise RuntimeError("a front-end process loads no artifact: the engine process does")

    async def start(self) -> None:
        await super().start()
        self.link.tell("listening")

    async def load(self) -> None:
        """Ready once every front end is: the engine process's models, with this process's tokenizers,
        then the engine process's word that all front ends have theirs ("serving"). A connection lands
        on any front end, so one that said ready while another still read its tokenizers had a probe
        answered 200 and the next request 503. A tokenizer is read on a daemon thread, as the
        one-process server loads its artifacts (a Qwen vocabulary takes about half a second a model to
        parse): the event loop goes on answering health checks and refusing requests as not ready
        meanwhile."""
        if await self.link.wait_state("ready", "serving", "draining") == "draining":
            return
        if not self.models.models:  # else loaded before listening (serve: a restart)
            await self._add_models()
        self.link.tell("ready")
        if await self.link.wait_state("serving", "draining") == "serving":
            self.models.set_ready()

    async def _add_models(self) -> None:
        for hosted in self.link.models.values():
            try:
                engine = await in_daemon_thread(LinkedEngine, self.link, hosted, self.config.tokenize_threads)
            except BoundgenError as exc:  # its files gone since the engine loaded them: one line, no traceback
                raise BoundgenError(f"model {hosted['name']}: {exc}") from None
            self.models.add(engine, hosted["source"])

    async def drain(self) -> None:
        self.models.start_draining()  # admits nothing more, then: the engine sends what it holds back
        self.link.tell("draining")  # for this front end (its 429s held by --refusal-hold-ms) at once
        await super().drain()

    async def serve(self, stop: asyncio.Event) -> int:
        async def engine_gone():
            await self.link.closed.wait()
            self.say("the engine process closed the link; stopping")
            stop.set()

        await self.link.connect()
        watcher = asyncio.ensure_future(engine_gone())
        try:
            restart = await self.link.wait_state("loading", "ready", "serving", "draining") in ("ready", "serving")
            if restart:
                # The other front ends serve meanwhile, so this one loads its tokenizers before it listens
                # (listening first, it took its share of new connections and answered them 503).
                await self._add_models()
                if self.link.state == "serving":
                    self.models.set_ready()
            # Stopped while it loaded (SIGTERM, the engine gone): it never listened, so there is nothing to drain.
            code = 0 if restart and stop.is_set() else await super().serve(stop)
        finally:
            watcher.cancel()
        if self.link.closed.is_set() and self.link.state != "draining":
            return ENGINE_GONE_EXIT
        return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="boundgen-frontend", description=__doc__.splitlines()[0])
    p.add_argument("artifacts", nargs="+")
    p.add_argument("--link", required=True, help="the engine process's Unix socket")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--config", required=True, help="ServerConfig as JSON")
    args = p.parse_args(argv)
    exit_with_parent("the engine process is gone; this front end exits")
    config = ServerConfig(**json.loads(args.config))
    engine_link = EngineLink(args.link, args.index)
    try:
        return serve_until_signal(lambda: (FrontendServer(args.artifacts, config, engine_link, args.index), None),
                                  config.log_format, config.log_level)
    except EngineGone:
        return ENGINE_GONE_EXIT
    except BoundgenError as exc:
        logs.say(sys.stderr, f"[front end {args.index}] boundgen serve: error: {exc}")  # written at exit
        return 1


if __name__ == "__main__":
    sys.exit(main())
