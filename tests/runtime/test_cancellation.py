"""Cancellation inside the engine: a request whose `cancelled` event is set while it waits (for the
batcher's worker, batched or not) fails with Cancelled while the busy call still runs,
and never reaches the model runner; a request with an event that stays clear still runs. The one
context is held busy by a runner that blocks on an Event (tests/runtime/held.py), so nothing here
depends on how fast anything runs."""

from __future__ import annotations

import threading

import pytest

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.errors import Cancelled
from boundgen.artifact.program import BeamSpec
from boundgen.programs.eager import eager_engine
from tests.runtime.held import held, in_thread, tokens_of, release_and_check, wait_until


def waiting_callers(engine, batching: bool):
    """A count that grows once a caller waits inside the engine: requests in the batcher's queue
    (every request waits there, batched or not: a batch of one is the unbatched case)."""
    return lambda: len(engine._batcher._waiting)


def cancelled_event() -> threading.Event:
    gone = threading.Event()
    gone.set()
    return gone


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "contexts"])
def test_cancelled_while_waiting_never_runs(tiny_qwen3_dir, score_spec, batching):
    engine = eager_engine(tiny_qwen3_dir, score_spec, runtime=RuntimeConfig(batching=batching))
    names = ("first holds the worker", "cancelled while waiting", "cancelled before", "not cancelled")
    tokens = {name: tokens_of(engine, name) for name in names}
    waiting = waiting_callers(engine, batching)
    with held(engine) as runner:
        first, first_out = in_thread(engine.score, ["first holds the worker"])
        assert runner.started.wait(30)
        seen = waiting()
        gone = threading.Event()
        thread, out = in_thread(engine.score, ["cancelled while waiting"], cancelled=gone)
        wait_until(lambda: waiting() > seen, "the request to cancel waits inside the engine")
        gone.set()
        thread.join(30)
        assert not thread.is_alive(), "the cancelled caller still waits for the busy call"
        assert isinstance(out.get("error"), Cancelled) and "not run" in str(out["error"]), out
        with pytest.raises(Cancelled, match="not run"):
            engine.score(["cancelled before"], cancelled=cancelled_event())
        seen = waiting()
        later, later_out = in_thread(engine.score, ["not cancelled"], cancelled=threading.Event())
        wait_until(lambda: waiting() > seen, "the uncancelled request waits inside the engine")
        _, later_result = release_and_check(runner, [(first, first_out), (later, later_out)],
                                            [tokens["first holds the worker"], tokens["not cancelled"]])
        assert later_result.scores.shape == (1, 2)
        if batching:
            assert engine._batcher.cancelled == 1  # the one cancelled before never entered the queue


def test_batched_beam_cancelled_while_queued_never_runs(tiny_qwen2_dir):
    engine = eager_engine(tiny_qwen2_dir, BeamSpec(width=2, steps=2, max_prompt_tokens=16, max_requests=3),
                          runtime=RuntimeConfig(batching=True))
    with held(engine) as runner:
        first, first_out = in_thread(engine.beam, "first holds the worker")
        assert runner.started.wait(30)
        gone = threading.Event()
        thread, out = in_thread(engine.beam, "cancelled while queued", cancelled=gone)
        wait_until(lambda: len(engine._batcher._waiting) == 1, "the request to cancel is queued")
        gone.set()
        thread.join(30)
        assert not thread.is_alive() and isinstance(out.get("error"), Cancelled), out
        runner.release.set()
        first.join(30)
        assert len(first_out["result"].texts) == 2 and len(runner.calls) == 1
        assert len(engine.beam("not cancelled", cancelled=threading.Event()).texts) == 2
        assert len(runner.calls) == 2
