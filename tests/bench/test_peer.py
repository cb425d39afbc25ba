"""The HF peers on tiny checkpoints (CPU, float32): the numbers of plain, unpadded HF calls."""

import dataclasses

import numpy as np
import pytest
import torch

from boundgen.bench.peer import HFPeer, PeerOptions, batch_call, peer_call
from boundgen.bench.workloads import WORKLOADS, Request

SAMPLES = ((" the cat sat on the mat and then it", " yes", " a much longer sample" * 7),
           (" one more request", " with two samples of a different length" * 3))
PROMPTS = (" the quick brown fox jumps over the lazy dog", " a slow green turtle walks under the big tree")


@pytest.fixture(scope="module")
def score_peer(tiny_qwen3_dir):
    return HFPeer(tiny_qwen3_dir, device="cpu", options=PeerOptions(max_batch=2))


@pytest.fixture(scope="module")
def beam_peer(tiny_qwen2_dir):
    return HFPeer(tiny_qwen2_dir, device="cpu", options=PeerOptions(beam_scores=True))


def hf_label_probs(model, tokenizer, text, label_ids):
    """Softmax over the label logits at the last token of `text`, one unpadded forward."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float()
    return torch.softmax(logits[label_ids], dim=-1).numpy()


def hf_beam(model, tokenizer, prompt, width, steps):
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, num_beams=width, num_return_sequences=width, max_new_tokens=steps,
                             min_new_tokens=steps, length_penalty=0.0, do_sample=False, early_stopping=False,
                             pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True, output_scores=True)
    return out.sequences[:, ids.shape[1]:].numpy(), out.sequences_scores.numpy()


def assert_scores_match_hf(peer, reference_model, atol):
    requests = [Request(i, texts, (0,) * len(texts)) for i, texts in enumerate(SAMPLES)]
    ids = peer.label_token_ids([" yes", " no"])
    results = batch_call(peer, WORKLOADS["W1"])(requests)  # both requests in one call
    assert len(results) == 2
    for request, result in zip(requests, results):
        assert result.scores.shape == (len(request.texts), 2) and set(result.timings) == {"pre", "model", "post"}
        for text, got in zip(request.texts, result.scores):
            np.testing.assert_allclose(got, hf_label_probs(reference_model, peer.tokenizer, text, ids), atol=atol)


@pytest.mark.parametrize("pad", ["bucket", "longest"])
def test_score_equals_unpadded_hf_forward(score_peer, pad):
    score_peer.with_options(pad=pad, bucket=16)
    assert_scores_match_hf(score_peer, score_peer.model, atol=2e-6)


def test_padded_lengths(score_peer):
    score_peer.with_options(pad="bucket", bucket=64)
    assert [score_peer.padded_length(n) for n in ((1,), (64, 3), (65,), (48, 256))] == [64, 64, 128, 256]
    with pytest.raises(ValueError, match="fixed when it loads"):
        score_peer.with_options(mode="compiled")
    score_peer.with_options(pad="longest")
    assert score_peer.padded_length((48, 201, 7)) == 201


def test_label_must_be_one_token(score_peer):
    with pytest.raises(ValueError, match="expected one"):
        score_peer.label_token_ids([" yes please"])


def test_options_are_checked():
    with pytest.raises(ValueError, match="pads to buckets"):
        PeerOptions(mode="compiled", pad="longest")
    with pytest.raises(ValueError, match="peer mode"):
        PeerOptions(mode="jit")


def test_beam_candidates_equal_hf_generate(beam_peer):
    spec = dataclasses.replace(WORKLOADS["W2"], width=4, steps=3)
    requests = [Request(i, (p,), (0,)) for i, p in enumerate(PROMPTS)]
    together = batch_call(beam_peer, spec)(requests)  # two prompts of one length in one generate call
    for request, result in zip(requests, together):
        assert result.token_ids.shape == (4, 3) and len(result.texts) == 4
        tokens, scores = hf_beam(beam_peer.model, beam_peer.tokenizer, request.texts[0], 4, 3)
        np.testing.assert_array_equal(result.token_ids, tokens)
        np.testing.assert_allclose(result.scores, scores, atol=1e-5)
        alone = peer_call(beam_peer, spec)(request)
        np.testing.assert_array_equal(alone.token_ids, tokens)


def test_beam_scores_are_sums_of_logprobs(beam_peer):
    spec = dataclasses.replace(WORKLOADS["W2"], width=4, steps=3)
    prompt = PROMPTS[0]
    result = peer_call(beam_peer, spec)(Request(0, (prompt,), (0,)))
    assert (np.diff(result.scores) <= 1e-6).all()  # best first
    ids = beam_peer.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    for row, score in zip(result.token_ids, result.scores):
        seq = torch.cat([ids[0], torch.as_tensor(row, dtype=torch.int64)])[None]
        with torch.no_grad():
            logp = torch.log_softmax(beam_peer.model(seq).logits[0].float(), dim=-1)
        p = ids.shape[1]
        total = sum(logp[p - 1 + k, int(t)].item() for k, t in enumerate(row))
        assert total == pytest.approx(float(score), abs=1e-4)


@pytest.mark.slow
def test_compiled_peer_gives_the_hf_reference(tiny_qwen3_dir, tiny_qwen2_dir):
    """torch.compile (Inductor on CPU, no CUDA graphs): a few shapes, ~1-2 minutes on 2 cores."""
    score = HFPeer(tiny_qwen3_dir, device="cpu", options=PeerOptions(mode="compiled", bucket=64))
    reference = HFPeer(tiny_qwen3_dir, device="cpu").model
    assert_scores_match_hf(score, reference, atol=1e-5)
    beam = HFPeer(tiny_qwen2_dir, device="cpu", options=PeerOptions(mode="compiled", beam_scores=True))
    reference = HFPeer(tiny_qwen2_dir, device="cpu").model
    spec = dataclasses.replace(WORKLOADS["W2"], width=4, steps=3)
    for i, prompt in enumerate(PROMPTS):
        result = peer_call(beam, spec)(Request(i, (prompt,), (0,)))
        tokens, scores = hf_beam(reference, beam.tokenizer, prompt, 4, 3)
        np.testing.assert_array_equal(result.token_ids, tokens)
        np.testing.assert_allclose(result.scores, scores, atol=1e-4)
