"""Restarting front-end processes. The watch over them (server/deploy/frontends.py `_supervise`), on stand-in
processes: a restarted front end that is not ready in time is killed, a failed start is one that errs or crashes
before it is ready (not one killed from outside), and failed starts in a row stop serve. A restarted front end
(server/deploy/frontend.py) stopped while it loads its tokenizers never listens."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

from boundgen.server.config import ServerConfig
from boundgen.server.deploy import frontends
from boundgen.server.deploy.frontend import FrontendServer
from boundgen.server.deploy.frontends import _exit_words, _Frontend, _supervise


class NeverReady:
    """An EngineHost as `_supervise` asks it: no front end stuck, none ever ready."""

    def stuck(self, after_s: float) -> list[int]:
        return []

    def was_ready(self, pid: int) -> bool:
        return False


def test_a_start_fails_by_an_error_a_crash_or_a_timeout_not_by_an_outside_kill():
    fe = _Frontend(0, [], {}, 0)
    assert fe.failed_start(1, was_ready=False) is True
    assert fe.failed_start(-signal.SIGSEGV, was_ready=False) is True
    assert fe.failed_start(-signal.SIGKILL, was_ready=False) is None  # the OOM killer, an operator: no verdict
    assert fe.failed_start(-signal.SIGTERM, was_ready=False) is None
    assert fe.failed_start(1, was_ready=True) is False  # it had served: the count starts again
    fe.start_timed_out = True  # killed by the watch itself for not becoming ready
    assert fe.failed_start(-signal.SIGKILL, was_ready=False) is True
    assert _exit_words(3) == "exited with code 3" and _exit_words(-9) == "was killed by SIGKILL"


def test_a_restarted_front_end_that_never_becomes_ready_is_killed_and_counted(monkeypatch):
    """A restart that hangs before it is ready (it does not listen yet) would hang there for ever: killed
    START_TIMEOUT_S after its start, a failed start; MAX_FAILED_STARTS of them in a row stop serve."""
    monkeypatch.setattr(frontends, "START_TIMEOUT_S", 1.0)
    monkeypatch.setattr(frontends, "MAX_FAILED_STARTS", 2)
    monkeypatch.setattr(frontends, "RESTART_BACKOFF_S", 0.01)
    lifeline, keep = os.pipe()
    fe = _Frontend(0, [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), lifeline)
    fe.start()
    said, stop = [], threading.Event()
    timer = threading.Timer(30, stop.set)  # a watch that never decides ends the test, failing it
    timer.start()
    try:
        why = _supervise([fe], stop, said.append, NeverReady(), hang_s=0)
    finally:
        timer.cancel()
        if fe.process.poll() is None:
            fe.process.kill()
        os.close(lifeline)
        os.close(keep)
    assert why is not None and "failed 2 starts in a row" in why and "was killed by SIGKILL" in why, (why, said)
    assert sum("was not ready 1 s after its start; killed it" in line for line in said) == 2, said
    assert sum("restarting it in" in line for line in said) == 1, said


class ReadyLink:
    """An EngineLink as a restarted front end meets it: the engine process is ready."""

    def __init__(self):
        self.models, self.told = {}, []

    async def connect(self) -> None:
        self.closed, self.state = asyncio.Event(), "ready"

    async def wait_state(self, *states: str) -> str:
        return self.state

    def tell(self, state: str) -> None:
        self.told.append(state)


def test_a_restart_stopped_while_it_loads_never_listens(tmp_path):
    """SIGTERM while a restarted front end loads its tokenizers (before it listens): it exits without
    listening (it listened, and took new connections it then reset, after serve had begun to drain)."""
    async def scenario():
        link, stop = ReadyLink(), asyncio.Event()
        server = FrontendServer([tmp_path], ServerConfig(http_port=0, grpc_port=0), link, 0)

        async def load_while_stopped():
            stop.set()  # the signal comes during the load

        server._add_models = load_while_stopped
        return await server.serve(stop), server, link

    code, server, link = asyncio.run(scenario())
    assert code == 0
    assert server.http_port is None and server.grpc_port is None and "listening" not in link.told
