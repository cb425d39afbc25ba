"""Workloads: exact token counts under the real Qwen tokenizer, deterministic from the seed."""

import dataclasses

import pytest

from boundgen.bench.workloads import WORKLOADS, TokenCodec, get_workload, make_requests, word_vocabulary
from boundgen.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return Tokenizer.from_dir(tiny_qwen3_dir)


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return word_vocabulary(TokenCodec(tokenizer))


def _packed_lengths(tokenizer, texts):
    """Token counts as the engine's own packer sees them."""
    return tuple(tokenizer.encode_packed(list(texts), max_tokens_per_sample=4096).lengths)


def test_word_vocabulary_round_trips_one_token_each(tokenizer, vocab):
    codec = TokenCodec(tokenizer)
    assert len(vocab) == 4096 and len(set(vocab.tolist())) == 4096
    for tid in vocab[:200]:
        assert codec.encode(codec.decode([tid])) == [int(tid)]


@pytest.mark.parametrize("name", ["W1", "W2", "W3"])
def test_requests_have_exact_token_counts(tokenizer, vocab, name):
    spec = WORKLOADS[name]
    requests = make_requests(spec, tokenizer, 6, seed=3, vocab=vocab)
    assert [r.index for r in requests] == list(range(6))
    for r in requests:
        assert r.samples == spec.samples
        assert all(spec.min_tokens <= n <= spec.max_tokens for n in r.token_counts)
        assert _packed_lengths(tokenizer, r.texts) == r.token_counts
    if name == "W2":
        assert all(r.token_counts == (64,) for r in requests)
    if name == "W3":
        assert all(r.token_counts == (400,) for r in requests)


def test_w1_lengths_cover_the_range(tokenizer, vocab):
    requests = make_requests(WORKLOADS["W1"], tokenizer, 20, seed=0, vocab=vocab)
    lengths = [n for r in requests for n in r.token_counts]
    assert len(lengths) == 300
    assert min(lengths) < 60 and max(lengths) > 244  # uniform over [48, 256]: both ends reached


def test_same_seed_same_pool_other_seed_other_pool(tokenizer, vocab):
    spec = dataclasses.replace(WORKLOADS["W1"], samples=3)
    a = make_requests(spec, tokenizer, 5, seed=7, vocab=vocab)
    b = make_requests(spec, tokenizer, 5, seed=7)  # vocabulary recomputed: same too
    c = make_requests(spec, tokenizer, 5, seed=8, vocab=vocab)
    assert a == b
    assert [r.texts for r in a] != [r.texts for r in c]
    assert len({r.texts for r in a}) == 5  # distinct requests


def test_unknown_workload_is_named():
    with pytest.raises(ValueError, match="W4.*W1, W2, W3"):
        get_workload("W4")
