"""Helpers for tests that keep an engine busy without depending on how fast anything runs: the
model runner is wrapped so that its first call blocks on an Event until the test releases it,
and every call's tokens are recorded (a request that never ran has no tokens there)."""

from __future__ import annotations

import contextlib
import threading
import time


class HeldRunner:
    """Wraps a model runner: records the tokens of every call; the first call waits for `release`."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, tokens, positions, cu_seqlens):
        self.calls.append(tokens.tolist())
        if len(self.calls) == 1:
            self.started.set()
            assert self.release.wait(30), "the test never released the runner"
        return self.runner(tokens, positions, cu_seqlens)


def tokens_of(engine, text: str) -> list[int]:
    """The tokens the engine's program is called with for a one-text request (unpadded)."""
    return engine.packer.encode([text]).tokens.tolist()


def hold(engine) -> HeldRunner:
    engine.runner = HeldRunner(engine.runner)
    return engine.runner


@contextlib.contextmanager
def held(engine):
    """`hold(engine)` for the body of a with-block; then the runner is released and the engine closed."""
    runner = hold(engine)
    try:
        yield runner
    finally:
        runner.release.set()
        engine.close()


def in_thread(fn, *args, **kwargs):
    out = {}

    def call():
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread, out


def release_and_check(runner, calls, ran: list) -> list:
    """Release the held runner and wait for `calls` ((thread, out) pairs from `in_thread`): each
    must have succeeded, and the runner must have run exactly the tokens in `ran`, in that order
    (requests dropped while waiting never reach it). Returns the calls' results."""
    runner.release.set()
    for thread, _ in calls:
        thread.join(30)
    outs = [out for _, out in calls]
    assert all("error" not in out for out in outs), outs
    assert runner.calls == ran
    return [out["result"] for out in outs]


def wait_until(predicate, what):
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")
