"""Deadlines inside the engine: a request whose deadline passes while it waits (for the batcher's
worker, batched or not) is failed with DeadlineExceeded and never reaches the model
runner; a request with time left still runs. The one context is held busy by a runner that
blocks on an Event (tests/runtime/held.py), so nothing here depends on how fast anything runs."""

from __future__ import annotations

import time

import pytest

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.errors import DeadlineExceeded
from boundgen.artifact.program import BeamSpec
from boundgen.programs.eager import eager_engine
from tests.runtime.held import held, in_thread, tokens_of, release_and_check, wait_until

SOON = 0.05  # seconds: a deadline that passes while the runner is held
LATER = 60.0  # a deadline no test reaches


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "contexts"])
def test_expired_while_waiting_never_runs(tiny_qwen3_dir, score_spec, batching):
    engine = eager_engine(tiny_qwen3_dir, score_spec, runtime=RuntimeConfig(batching=batching))
    names = ("first holds the worker", "expires while queued", "already late", "has time left")
    tokens = {name: tokens_of(engine, name) for name in names}
    waited_for = "waiting for model"  # batched or not: every request waits in the batcher
    with held(engine) as runner:
        first, first_out = in_thread(engine.score, ["first holds the worker"])
        assert runner.started.wait(30)
        with pytest.raises(DeadlineExceeded, match=f"{waited_for}.*not run"):  # while the worker is still held
            engine.score(["expires while queued"], deadline=time.monotonic() + SOON)
        with pytest.raises(DeadlineExceeded, match="not run"):
            engine.score(["already late"], deadline=time.monotonic() - 1.0)
        later, later_out = in_thread(engine.score, ["has time left"], deadline=time.monotonic() + LATER)
        if batching:
            wait_until(lambda: len(engine._batcher._waiting) == 1, "the request with time left is queued")
        _, later_result = release_and_check(runner, [(first, first_out), (later, later_out)],
                                            [tokens["first holds the worker"], tokens["has time left"]])
        assert later_result.scores.shape == (1, 2)
        if batching:
            assert engine._batcher.expired == 1  # the already-late one never entered the queue


def test_expired_waiting_requests_take_no_room_in_the_batch(tiny_qwen3_dir, score_spec):
    """A worker taking a batch drops what expired in the queue: the batch is the live requests."""
    clock = [0.0]
    engine = eager_engine(tiny_qwen3_dir, score_spec, runtime=RuntimeConfig(batching=True))
    engine._batcher._clock = lambda: clock[0]  # the deadline check's clock, moved by the test
    with held(engine) as runner:
        first, _ = in_thread(engine.score, ["first holds the worker"])
        assert runner.started.wait(30)
        waiting = []
        for i, deadline in enumerate([10.0, None, 10.0, None]):  # two expire before the worker is free
            waiting.append(in_thread(engine.score, [f"waiting {i}"] * 3, deadline=deadline))
            wait_until(lambda: len(engine._batcher._waiting) == i + 1, f"request {i} queued")
        clock[0] = 20.0
        runner.release.set()
        for thread, _ in [(first, None), *waiting]:
            thread.join(30)
        outs = [out for _, out in waiting]
        assert isinstance(outs[0]["error"], DeadlineExceeded) and isinstance(outs[2]["error"], DeadlineExceeded)
        assert outs[1]["result"].scores.shape == (3, 2) and outs[3]["result"].scores.shape == (3, 2)
        # 3 + 3 samples fit the call's 6 only because the expired requests were dropped first.
        assert len(runner.calls) == 2 and engine._batcher.expired == 2
        assert outs[1]["result"].timings["batch_requests"] == 2


def test_batched_beam_past_deadline_never_runs(tiny_qwen2_dir):
    engine = eager_engine(tiny_qwen2_dir, BeamSpec(width=2, steps=2, max_prompt_tokens=16, max_requests=3),
                          runtime=RuntimeConfig(batching=True))
    with held(engine) as runner:
        first, first_out = in_thread(engine.beam, "first holds the worker")
        assert runner.started.wait(30)
        with pytest.raises(DeadlineExceeded, match="not run"):
            engine.beam("expires while queued", deadline=time.monotonic() + SOON)
        runner.release.set()
        first.join(30)
        assert len(first_out["result"].texts) == 2 and len(runner.calls) == 1
        assert len(engine.beam("has time left", deadline=time.monotonic() + LATER).texts) == 2
