"""The in-process API's bad input: each a boundgen error naming what is wrong, before anything runs,
and the engine serving on after it. Each case was a raw TypeError, ValueError, OverflowError,
AttributeError, a busy wait or a leak before (a round on the Python API, 2026-12-07)."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

import boundgen
from boundgen.errors import BoundgenError, ConfigError, EngineClosed, InvalidInput, WrongTask


@pytest.fixture(scope="module")
def engines(score_artifact, beam_artifact):
    score, beam = boundgen.load(score_artifact), boundgen.load(beam_artifact)
    yield score, beam
    score.close()
    beam.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"deadline": "x"}, "deadline must be time.monotonic"),
    ({"deadline": float("nan")}, "deadline must be time.monotonic"),  # never expired, and spun a core waiting
    ({"deadline": True}, "deadline must be time.monotonic"),
    ({"cancelled": True}, "cancelled must be a threading.Event"),
])
def test_bad_deadlines_and_cancel_events_are_invalid_input(engines, kwargs, message):
    score, beam = engines
    with pytest.raises(InvalidInput, match=message):
        score.score(["a"], **kwargs)
    with pytest.raises(InvalidInput, match=message):
        beam.beam("a", **kwargs)


def test_a_deadline_far_away_or_infinite_is_waited_for(engines):
    """+inf is no deadline; 1e10 s away overflowed the wait (OverflowError) after the request was queued,
    so it ran and its result was dropped."""
    score, beam = engines
    want = score.score(["a"]).scores
    for deadline in (float("inf"), time.monotonic() + 1e10, np.float64(time.monotonic() + 60)):
        assert np.array_equal(score.score(["a"], deadline=deadline).scores, want)
        assert beam.beam("a", deadline=deadline).candidates()


@pytest.mark.parametrize("texts, message", [
    (None, "score takes a list of texts, got NoneType"),
    (5, "score takes a list of texts, got int"),
    (b"hi", "score takes a list of texts, got bytes"),
    ({"a", "b"}, "score takes a list of texts, got set"),
    ({"a": 1}, "score takes a list of texts, got dict"),
    # read as U+FFFD by tiktoken, a TypeError by tokenizers
    (["a\ud800b"], "sample 0 is not valid UTF-8 text: it holds a lone surrogate"),
])
def test_score_input_of_the_wrong_kind_is_invalid_input(engines, texts, message):
    with pytest.raises(InvalidInput, match=message):
        engines[0].score(texts)


def test_an_endless_iterable_is_read_no_further_than_the_bound(engines):
    with pytest.raises(InvalidInput, match="accepts at most 4"):
        engines[0].score(itertools.repeat("a"))  # was read into memory for ever
    assert engines[0].score(iter(["a", "b"])).scores.shape == (2, 2)


def test_a_long_whitespace_run_is_a_token_count_error_not_a_tokenizer_crash(engines):
    """tiktoken's regex gives up after a million whitespace characters before a letter (a ValueError,
    or a Rust panic on another path): such texts go to `tokenizers`, whose count the bound refuses."""
    with pytest.raises(InvalidInput, match="tokens, more than the limit"):
        engines[0].score([" " * 1_000_000 + "a"])
    with pytest.raises(InvalidInput, match="tokens, more than the limit"):
        engines[1].beam(" " * 1_000_000 + "a")


def test_token_ids_as_numpy_arrays_and_bad_ids_input(engines):
    score = engines[0]
    want = score.score_ids([[1, 2, 3]]).scores
    assert np.array_equal(score.score_ids(np.array([[1, 2, 3]])).scores, want)  # was "truth value ... ambiguous"
    assert np.array_equal(score.score_ids([[np.int64(1), 2, 3]]).scores, want)
    for samples in (5, None, "ab"):
        with pytest.raises(InvalidInput, match="score_ids takes a list of samples"):
            score.score_ids(samples)


def test_the_other_tasks_method_and_a_closed_engine_are_boundgen_errors(engines, score_artifact):
    score, beam = engines
    for call in (lambda: score.beam("a"), lambda: beam.score(["a"]), lambda: beam.score_ids([[1]])):
        with pytest.raises(WrongTask) as raised:
            call()
        assert isinstance(raised.value, (InvalidInput, NotImplementedError))
    closed = boundgen.load(score_artifact)
    closed.close()
    with pytest.raises(EngineClosed) as raised:
        closed.score(["a"])
    assert isinstance(raised.value, (BoundgenError, RuntimeError))


def test_load_refuses_bad_arguments_with_config_errors_and_leaks_nothing(score_artifact, tmp_path):
    with pytest.raises(BoundgenError, match="an artifact is a directory path"):
        boundgen.load(None)
    with pytest.raises(ConfigError, match="unknown runtime settings foo"):
        boundgen.load(score_artifact, foo=1)
    with pytest.raises(ConfigError, match="libstdcxx_check must be"):
        boundgen.load(score_artifact, libstdcxx_check="x")
    before = threading.active_count()
    for _ in range(3):  # a catalogue for an artifact that takes none: each failed load left its batch threads
        with pytest.raises(ConfigError):
            boundgen.load(score_artifact, catalogue=tmp_path)
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before
