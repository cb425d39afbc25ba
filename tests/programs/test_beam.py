"""The beam program against HF `generate` (FP32): same candidates in the same order, same scores,
same parent indices at every step; with and without stop tokens actually produced."""

import pytest
import torch

from boundgen.errors import ConfigError
from boundgen.model.loader import load_model
from boundgen.ops.lowering import OpLowering
from boundgen.programs.beam import BeamProgram
from tests.hf_reference import make_hf_model, save

PROMPT_LEN = 11


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for family, kw in (("qwen3", dict(tied=False, head_dim=16)), ("qwen2", dict())):
        hf = make_hf_model(family, seed=7, **kw)
        out[family] = (hf, load_model(save(hf, tmp_path_factory.mktemp(family))))
    return out


def run_ours(model, prompt, width, steps, **kw):
    prog = BeamProgram(model, width, steps, **kw)
    cu = torch.tensor([0, len(prompt)], dtype=torch.int32)
    with torch.no_grad():
        return prog(prompt, torch.arange(len(prompt)), cu)


def run_hf(hf, prompt, width, steps, stops, **kw):
    with torch.no_grad():
        return hf.generate(prompt[None], num_beams=width, num_return_sequences=width, max_new_tokens=steps,
                           do_sample=False, output_scores=True, output_logits=True, return_dict_in_generate=True,
                           eos_token_id=stops, pad_token_id=stops[0], **kw)


def strip(row, stops):
    """Generated ids up to and including the first stop token (HF pads after it)."""
    out = []
    for t in row:
        t = int(t)
        if t < 0:
            break
        out.append(t)
        if t in stops:
            break
    return out


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("width", [1, 4, 64])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5])
def test_matches_hf_generate_min_new_tokens(models, family, width, steps):
    hf, model = models[family]
    prompt = torch.randint(0, 512, (PROMPT_LEN,), generator=torch.Generator().manual_seed(width * 10 + steps))
    stops = [3]
    seq, scores, finished, parents = run_ours(model, prompt, width, steps, stop_token_ids=stops,
                                              min_new_tokens=steps)
    out = run_hf(hf, prompt, width, steps, stops, min_new_tokens=steps, length_penalty=0.0)
    assert torch.equal(out.sequences[:, PROMPT_LEN:], seq), "candidate sequences differ"
    assert not finished.any()
    if width == 1:  # HF runs greedy search: score = sum of the chosen tokens' log-probs
        logp = torch.stack([torch.log_softmax(l[0].float(), -1)[t] for l, t in zip(out.logits, seq[0])])
        torch.testing.assert_close(scores[0], logp.sum(), rtol=0, atol=1e-4)
    else:
        torch.testing.assert_close(scores, out.sequences_scores, rtol=0, atol=1e-4)
        assert torch.equal(out.beam_indices[:, :steps].long(), parents), "parent indices differ"


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("lowering", ["chunks", "chunks-triton", "torch-lse"])
def test_other_selection_lowerings_match_hf_generate(models, family, lowering):
    """Candidate selection by another lowering (on CPU: the torch form of its kernels) gives HF's
    beams: same sequences, scores, parents; stop tokens barred below min_new_tokens."""
    hf, model = models[family]
    default_ops = model.ops
    model.ops = OpLowering(vocab_topk=lowering).resolve()
    try:
        for width, steps in ((4, 3), (64, 5)):
            prompt = torch.randint(0, 512, (PROMPT_LEN,), generator=torch.Generator().manual_seed(width + steps))
            seq, scores, _, parents = run_ours(model, prompt, width, steps, stop_token_ids=[3], min_new_tokens=2)
            out = run_hf(hf, prompt, width, steps, [3], min_new_tokens=2, length_penalty=0.0)
            ours = [strip(r, [3]) for r in seq.tolist()]
            theirs = [strip(r, [3]) for r in out.sequences[:, PROMPT_LEN:].tolist()]
            assert ours == theirs, f"W={width}: candidate sequences differ"
            torch.testing.assert_close(scores, out.sequences_scores, rtol=0, atol=1e-4)
            for ours_bi, hf_bi, r in zip(parents.tolist(), out.beam_indices.tolist(), ours):
                assert ours_bi[:len(r)] == hf_bi[:len(r)]
    finally:
        model.ops = default_ops


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
@pytest.mark.parametrize("width", [1, 4, 16])
def test_stop_tokens_produced_like_hf(tmp_path, width, length_penalty):
    stops = [5, 7]
    hf = make_hf_model("qwen3", seed=11, tied=False, boost={5: 3.0, 7: 3.0})
    model = load_model(save(hf, tmp_path))
    seen_finished = 0
    for trial in range(4):
        prompt = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(trial))
        seq, scores, finished, parents = run_ours(model, prompt, width, 5, stop_token_ids=stops,
                                                  length_penalty=length_penalty)
        out = run_hf(hf, prompt, width, 5, stops, length_penalty=length_penalty)
        ours = [strip(r, stops) for r in seq.tolist()]
        theirs = [strip(r, stops) for r in out.sequences[:, 9:].tolist()]
        assert ours == theirs, f"trial {trial}"
        assert finished.tolist() == [r[-1] in stops for r in ours]
        seen_finished += int(finished.sum())
        if width > 1:
            torch.testing.assert_close(scores, out.sequences_scores, rtol=0, atol=1e-4)
            for ours_bi, hf_bi, r in zip(parents.tolist(), out.beam_indices.tolist(), ours):
                assert ours_bi[:len(r)] == hf_bi[:len(r)]
    assert seen_finished > 0, "the boosted stop tokens were never produced: the test would prove nothing"


def test_bounds_are_checked(models):
    _, model = models["qwen3"]
    with pytest.raises(ConfigError):
        BeamProgram(model, 300, 3)  # keeps 600 candidates > vocabulary 512
    with pytest.raises(ConfigError):
        BeamProgram(model, 4, 0)
