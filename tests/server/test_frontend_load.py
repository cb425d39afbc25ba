"""A front-end process reads its models' tokenizers off its event loop (server/deploy/frontend.py)."""

from __future__ import annotations

import asyncio
import time

from boundgen.server.config import ServerConfig
from boundgen.server.deploy import frontend


class _ReadyLink:
    """The engine process's side as a front end's load sees it: its two models loaded ("ready"), and
    every front end ready ("serving") once `serving` is set."""

    models = {"a": {"source": "/models/a"}, "b": {"source": "/models/b"}}

    def __init__(self, serving: bool = True):
        self.told, self.serving = [], asyncio.Event()
        if serving:
            self.serving.set()

    async def wait_state(self, *states):
        if "ready" in states:
            return "ready"
        await self.serving.wait()
        return "serving"

    def tell(self, what):
        self.told.append(what)


def test_the_event_loop_runs_while_tokenizers_load(monkeypatch):
    """Each model's tokenizer takes 0.3 s here: the loop must go on turning meanwhile (it answers health
    checks and refuses requests as not ready), and the front end is ready with both models after."""
    added = []

    class SlowEngine:
        def __init__(self, link, hosted, threads):
            time.sleep(0.3)  # a tokenizer's vocabulary being parsed
            self.source = hosted["source"]

    link = _ReadyLink()
    monkeypatch.setattr(frontend, "LinkedEngine", SlowEngine)
    server = frontend.FrontendServer(["/models/a"], ServerConfig(), link, 0)
    monkeypatch.setattr(server.models, "add", lambda engine, source: added.append((engine.source, source)))
    monkeypatch.setattr(server.models, "set_ready", lambda: added.append("ready"))

    async def main():
        turns = 0
        loading = asyncio.ensure_future(server.load())
        while not loading.done():
            await asyncio.sleep(0.01)
            turns += 1
        await loading
        return turns

    turns = asyncio.run(main())
    assert turns >= 20, f"the event loop turned {turns} times in 0.6 s of loading"
    assert added == [("/models/a", "/models/a"), ("/models/b", "/models/b"), "ready"]
    assert link.told == ["ready"]


def test_ready_only_once_the_engine_process_says_every_front_end_is(monkeypatch):
    """A front end with its tokenizers says so to the engine process and waits: it answers ready (and
    admits requests) only when told "serving", so that no probe finds one front end ready while a
    connection to another is refused as not ready."""
    class Engine:
        def __init__(self, link, hosted, threads):
            self.source = hosted["source"]

    ready = []
    monkeypatch.setattr(frontend, "LinkedEngine", Engine)

    async def main():
        link = _ReadyLink(serving=False)
        server = frontend.FrontendServer(["/models/a"], ServerConfig(), link, 0)
        monkeypatch.setattr(server.models, "add", lambda engine, source: None)
        monkeypatch.setattr(server.models, "set_ready", lambda: ready.append(True))
        loading = asyncio.ensure_future(server.load())
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert link.told == ["ready"] and not ready and not loading.done()  # its tokenizers, not yet serving
        link.serving.set()
        await loading
        assert ready == [True]

    asyncio.run(main())
