"""Concurrent score requests batched into one call give the same results as one call each."""

import numpy as np
import pytest

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import ScoreSpec
from boundgen.programs.eager import eager_engine
from boundgen.runtime.requests import concat_packed
from boundgen.text.tokenizer import Tokenizer
from tests.concurrency import assert_batched_beams_equal_single, call_together

TEXTS = [["a relevant document about shoes", "no"], ["x"], ["lamp", "desk lamp", "three samples here"], ["yes"]]


@pytest.fixture(scope="module")
def engines(tiny_qwen3_dir):
    ids = Tokenizer.from_dir(tiny_qwen3_dir).label_token_ids((" yes", " no"))
    spec = ScoreSpec(labels=(" yes", " no"), label_token_ids=ids, max_samples=6, max_tokens_per_sample=32,
                     max_total_tokens=64)
    single = eager_engine(tiny_qwen3_dir, spec)
    batched = eager_engine(tiny_qwen3_dir, spec, runtime=RuntimeConfig(batching=True))
    yield single, batched
    batched.close()


def test_concat_packed(tiny_qwen3_dir):
    tok = Tokenizer.from_dir(tiny_qwen3_dir)
    a, b = tok.encode_packed(["one two", "three"], 16), tok.encode_packed(["four five six"], 16)
    ab = concat_packed([a, b])
    assert ab.cu_seqlens.tolist() == [0, a.lengths[0], a.num_tokens, a.num_tokens + b.num_tokens]
    assert ab.lengths == a.lengths + b.lengths and ab.positions.tolist()[-1] == b.lengths[0] - 1


def test_batched_equals_single(engines):
    single, batched = engines
    assert batched.spec.runtime.batching and not single.spec.runtime.batching
    expected = [single.score(t).scores for t in TEXTS]
    results = call_together(batched.score, TEXTS)
    for exp, res in zip(expected, results):
        np.testing.assert_allclose(res.scores, exp, rtol=1e-5, atol=1e-6)
    assert batched._batcher.items == len(TEXTS)


def test_program_call_for_the_diagnostic(engines):
    from boundgen.bench.diagnostic import program_alone

    single, batched = engines
    probs = program_alone(batched, TEXTS[2])()[0]
    np.testing.assert_allclose(probs[:3].numpy(), single.score(TEXTS[2]).scores, rtol=1e-5, atol=1e-6)


def test_warmup_goes_through_the_batcher(engines):
    _, batched = engines
    served = batched._batcher.items
    batched.warmup()
    assert batched._batcher.items == served + 1


def test_batched_bad_input_is_the_callers_error(engines):
    from boundgen.errors import InvalidInput

    _, batched = engines
    with pytest.raises(InvalidInput, match="at most 6"):
        batched.score(["x"] * 7)
    assert batched.score(["still fine"]).scores.shape == (1, 2)


PROMPTS = ["generative retrieval: shoes", "x", "a longer prompt about running shoes and socks", "lamp"]


def test_batched_beams_equal_single(tiny_qwen2_dir):
    from boundgen.artifact.program import BeamSpec

    spec = BeamSpec(width=4, steps=3, max_prompt_tokens=16, max_requests=3)
    single = eager_engine(tiny_qwen2_dir, spec)
    batched = eager_engine(tiny_qwen2_dir, spec, runtime=RuntimeConfig(batching=True))
    assert batched.spec.runtime.batching and not single.spec.runtime.batching
    assert_batched_beams_equal_single(single, batched, PROMPTS, most=3)


def test_calls_that_wait_for_company_give_the_same_beams(tiny_qwen2_dir):
    from boundgen.artifact.program import BeamSpec

    spec = BeamSpec(width=4, steps=3, max_prompt_tokens=16, max_requests=3)
    single = eager_engine(tiny_qwen2_dir, spec)
    waiting = eager_engine(tiny_qwen2_dir, spec, runtime=RuntimeConfig(batching=True, batch_wait_ms=20))
    assert waiting.spec.runtime.batch_wait_ms == 20 and single.spec.runtime.batch_wait_ms == 0.0
    assert_batched_beams_equal_single(single, waiting, PROMPTS, most=3)
    learning = eager_engine(tiny_qwen2_dir, spec, runtime=RuntimeConfig(batching=True, batch_wait_ms=5,
                                                                        batch_wait_learned=True))
    assert learning._batcher._company.learned and not waiting._batcher._company.learned
    assert_batched_beams_equal_single(single, learning, PROMPTS, most=3)
    alone = eager_engine(tiny_qwen2_dir, spec, runtime=RuntimeConfig(batch_wait_learned=True))  # no batching: no wait
    assert not alone.spec.runtime.batch_wait_learned and not alone._batcher._company.learned
