"""A front-end process reads its models' tokenizers off its event loop (server/deploy/frontend.py)."""

from __future__ import annotations

import asyncio
import time

from boundgen.server.config import ServerConfig
from boundgen.server.deploy import frontend


class _ReadyLink:
    """The engine process's side as a front end's load sees it: ready, with two models."""

    models = {"a": {"source": "/models/a"}, "b": {"source": "/models/b"}}

    def __init__(self):
        self.told = []

    async def wait_state(self, *states):
        return "ready"

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
