"""The HF peer on tiny checkpoints (CPU, float32): same numbers as unpadded HF calls."""

import dataclasses

import numpy as np
import pytest
import torch

from boundgen.bench.peer import HFPeer, peer_call
from boundgen.bench.workloads import WORKLOADS, Request


@pytest.fixture(scope="module")
def score_peer(tiny_qwen3_dir):
    return HFPeer(tiny_qwen3_dir, device="cpu")


def test_padded_batch_scores_equal_each_sample_alone(score_peer):
    texts = (" the cat sat on the mat and then it", " yes", " a much longer sample" * 7)
    result = peer_call(score_peer, WORKLOADS["W1"])(Request(0, texts, (0, 0, 0)))
    assert result.scores.shape == (3, 2) and set(result.timings) == {"pre", "model", "post"}
    np.testing.assert_allclose(result.scores.sum(axis=1), 1.0, rtol=1e-6)
    ids = score_peer.label_token_ids([" yes", " no"])
    for i, text in enumerate(texts):
        alone = score_peer.score([text], ids).scores[0]
        np.testing.assert_allclose(result.scores[i], alone, atol=2e-6)


def test_label_must_be_one_token(score_peer):
    with pytest.raises(ValueError, match="expected one"):
        score_peer.label_token_ids([" yes please"])


def test_beam_scores_are_sums_of_logprobs(tiny_qwen2_dir):
    peer = HFPeer(tiny_qwen2_dir, device="cpu", beam_scores=True)
    spec = dataclasses.replace(WORKLOADS["W2"], width=4, steps=3)
    prompt = " the quick brown fox jumps over the lazy dog"
    result = peer_call(peer, spec)(Request(0, (prompt,), (0,)))
    assert result.token_ids.shape == (4, 3) and len(result.texts) == 4
    assert (np.diff(result.scores) <= 1e-6).all()  # best first
    ids = peer.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    for row, score in zip(result.token_ids, result.scores):
        seq = torch.cat([ids[0], torch.as_tensor(row, dtype=torch.int64)])[None]
        with torch.no_grad():
            logp = torch.log_softmax(peer.model(seq).logits[0].float(), dim=-1)
        p = ids.shape[1]
        total = sum(logp[p - 1 + k, int(t)].item() for k, t in enumerate(row))
        assert total == pytest.approx(float(score), abs=1e-4)
