"""Validation cases cover the bounds; a disagreement beyond tolerance fails with a clear message."""

import torch

from boundgen.compile import validate
from boundgen.artifact.program import BeamSpec, ScoreSpec


def score_spec(**kw):
    return ScoreSpec(labels=(" yes", " no"), label_token_ids=(1, 2), **kw)


def test_score_cases_cover_the_bounds():
    spec = score_spec(max_samples=15, max_tokens_per_sample=256, max_total_tokens=3840)
    cases = {c.name: c.lengths for c in validate.cases(spec)}
    assert cases["one_sample_one_token"] == (1,)
    assert cases["max_samples_max_tokens"] == (256,) * 15
    assert cases["one_sample_max_tokens"] == (256,)
    padded = cases["padded_for_cuda_graphs"]
    assert len(padded) == 16 and sum(padded) == 3840 and padded[-1] == 0
    for lengths in cases.values():
        assert sum(lengths) <= 3840 and len(lengths) <= 16


def test_score_cases_respect_a_total_below_samples_x_tokens():
    spec = score_spec(max_samples=8, max_tokens_per_sample=100, max_total_tokens=150)
    for case in validate.cases(spec):
        assert sum(case.lengths) <= 150
        assert all(n <= 100 for n in case.lengths[:8])
    assert sum(dict((c.name, c.lengths) for c in validate.cases(spec))["max_samples_max_tokens"]) == 150


def test_beam_cases():
    cases = [(c.name, c.lengths, c.tail) for c in validate.cases(BeamSpec(width=100, steps=5, max_prompt_tokens=512))]
    assert cases == [("one_token_prompt", (1,), 0), ("representative", (64,), 0), ("max_prompt", (512,), 0),
                     ("padded_for_cuda_graphs", (64,), 7)]  # tokens of no request after the prompt
    # A one-token bound leaves no room for padding.
    assert [c.name for c in validate.cases(BeamSpec(width=2, steps=2, max_prompt_tokens=1))] == ["one_token_prompt"]


class Reference:
    def __call__(self, tokens, positions, cu_seqlens):
        b = cu_seqlens.shape[0] - 1
        probs = torch.softmax(torch.arange(2 * b, dtype=torch.float32).reshape(b, 2) / 7, dim=-1)
        return (probs,)


def test_within_tolerance_passes():
    spec = score_spec(max_samples=3, max_tokens_per_sample=4, max_total_tokens=12)
    near = lambda *x: (Reference()(*x)[0] + 5e-5,)  # noqa: E731
    report = validate.validate(near, Reference(), spec, ("probs",), "float32", "cpu", 100)
    assert report["passed"]
    assert all(abs(c["outputs"]["probs"]["max_abs_err"] - 5e-5) < 1e-6 for c in report["cases"])


def test_beyond_tolerance_fails_with_a_message_naming_case_and_output():
    spec = score_spec(max_samples=3, max_tokens_per_sample=4, max_total_tokens=12)
    far = lambda *x: (Reference()(*x)[0] + 1e-3,)  # noqa: E731
    report = validate.validate(far, Reference(), spec, ("probs",), "float32", "cpu", 100)
    assert not report["passed"]
    message = validate.failure_message(report)
    assert "one_sample_one_token (1 samples, 1 tokens): probs: max abs error" in message
    assert "> tolerance 0.0001" in message
    # bf16 tolerances are looser; the deploy file can tighten them per output
    assert validate.validate(far, Reference(), spec, ("probs",), "bfloat16", "cpu", 100)["passed"]
    assert not validate.validate(far, Reference(), spec, ("probs",), "bfloat16", "cpu", 100,
                                 {"probs": 1e-4})["passed"]


def test_wrong_dtype_or_nan_fails():
    spec = score_spec(max_samples=2, max_tokens_per_sample=4, max_total_tokens=8)
    half = lambda *x: (Reference()(*x)[0].half(),)  # noqa: E731
    report = validate.validate(half, Reference(), spec, ("probs",), "float32", "cpu", 100)
    assert not report["passed"] and "torch.float16" in validate.failure_message(report)
    nan = lambda *x: (Reference()(*x)[0] * float("nan"),)  # noqa: E731
    assert not validate.validate(nan, Reference(), spec, ("probs",), "float32", "cpu", 100)["passed"]


def test_candidate_ids_must_match_in_fp32_only():
    spec = BeamSpec(width=2, steps=2, max_prompt_tokens=4)
    ids = torch.tensor([[5, 6], [7, 8]])

    def ref(*x):
        return ids, torch.tensor([-1.0, -2.0]), torch.tensor([False, False]), torch.zeros(2, 2, dtype=torch.int64)

    def swapped(*x):
        return ids.flip(0), torch.tensor([-1.0, -2.0]), torch.tensor([False, False]), torch.zeros(2, 2, dtype=torch.int64)
    names = ("token_ids", "scores", "finished", "beam_indices")
    fp32 = validate.validate(swapped, ref, spec, names, "float32", "cpu", 100)
    assert not fp32["passed"] and fp32["cases"][0]["outputs"]["token_ids"]["identical_rows"] == 0.0
    assert validate.validate(swapped, ref, spec, names, "bfloat16", "cpu", 100)["passed"]


def test_candidate_overlap_counts_the_same_sequences_in_any_order():
    spec = BeamSpec(width=3, steps=2, max_prompt_tokens=4)
    rest = (torch.tensor([-1.0, -2.0, -3.0]), torch.zeros(3, dtype=torch.bool), torch.zeros(3, 2, dtype=torch.int64))
    ref = lambda *x: (torch.tensor([[5, 6], [7, 8], [1, 2]]),) + rest  # noqa: E731
    got = lambda *x: (torch.tensor([[7, 8], [5, 6], [3, 4]]),) + rest  # noqa: E731
    report = validate.validate(got, ref, spec, ("token_ids", "scores", "finished", "beam_indices"), "bfloat16",
                               "cpu", 100)
    token_ids = report["cases"][0]["outputs"]["token_ids"]
    assert token_ids["identical_rows"] == 0.0 and abs(token_ids["candidate_overlap"] - 2 / 3) < 1e-5
