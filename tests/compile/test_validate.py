"""Validation cases cover the bounds; a disagreement beyond tolerance fails with a clear message."""

import pytest
import torch

from boundgen.compile import report as build_report
from boundgen.compile import validate
from boundgen.model.loader import load_model
from boundgen.programs.factory import make_program
from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.programs.eager import EagerRunner


def score_spec(**kw):
    return ScoreSpec(labels=(" yes", " no"), label_token_ids=(1, 2), **kw)


def test_score_cases_cover_the_bounds():
    spec = score_spec(max_samples=15, max_tokens_per_sample=256, max_total_tokens=3840)
    cases = {c.name: c.lengths for c in validate.cases(spec)}
    assert cases["one_sample_one_token"] == (1,)
    assert cases["max_samples_max_tokens"] == (256,) * 15
    assert cases["one_sample_max_tokens"] == (256,)
    padded = cases["padded_for_cuda_graphs"]  # real samples, a filler shorter than a bucket, empty ones
    assert len(padded) == 16 and padded[-1] == 0 and padded[4] == 255
    assert validate.cases(spec, token_bucket=64)[-1].lengths[4] == 63
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


def test_an_exact_output_that_differs_fails_with_a_message():
    """Outputs compared for identity (ids) name the share of identical rows, not an error bound."""
    report = {"cases": [{"name": "representative", "samples": 2, "tokens": 9, "outputs": {
        "token_ids": {"identical": False, "identical_rows": 0.25, "passed": False}}}], "reference": "float32 eager"}
    assert validate.failure_message(report).endswith(
        "representative (2 samples, 9 tokens): token_ids: not identical (25.0% of rows are)")


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


BEAM_NAMES = ("token_ids", "scores", "finished", "beam_indices")
# One request of W = 4: candidate sequences (2 tokens) and scores, best first.
REF_SEQS = [[5, 6], [7, 8], [1, 2], [3, 4]]
REF_SCORES = [-1.0, -1.001, -1.5, -2.0]


def beam_runner(seqs, scores, finished=None):
    outputs = (torch.tensor(seqs), torch.tensor(scores, dtype=torch.float32),
               torch.tensor(finished or [False] * len(seqs)), torch.zeros(len(seqs), 2, dtype=torch.int64))
    return lambda *inputs: outputs


def beam_report(got, dtype="bfloat16", overrides=None, want=None, **kw):
    spec = BeamSpec(width=4, steps=2, max_prompt_tokens=4)
    return validate.validate(got, want or beam_runner(REF_SEQS, REF_SCORES), spec, BEAM_NAMES, dtype, "cpu", 100,
                             overrides, **kw)


# bf16 near the reference: the first two swapped (scores 0.001 apart), all scores off by < 0.01.
NEAR_SEQS = [[7, 8], [5, 6], [1, 2], [3, 4]]
NEAR_SCORES = [-0.998, -1.004, -1.49, -2.005]


def test_candidate_ids_must_match_in_fp32_only():
    """fp32: the same candidates in the same rows. bf16: a near tie may swap two candidates."""
    fp32 = beam_report(beam_runner(NEAR_SEQS, NEAR_SCORES), "float32")
    assert not fp32["passed"] and fp32["cases"][0]["outputs"]["token_ids"]["identical_rows"] == 0.5
    bf16 = beam_report(beam_runner(NEAR_SEQS, NEAR_SCORES))
    assert bf16["passed"], validate.failure_message(bf16)
    candidates = bf16["cases"][0]["outputs"]["candidates"]
    assert candidates["recall"] == 1.0 and candidates["top1"] == [True] and candidates["spearman"] == 0.8
    assert abs(candidates["scores_max_abs_err"] - 0.01) < 1e-6 and not candidates["failed"]
    assert bf16["cases"][0]["outputs"]["token_ids"]["candidate_overlap"] == 1.0
    summary = build_report.worst_errors(bf16)  # compile/report.py reads the judged entries
    assert summary.startswith("passed: scores 1.0e-02, candidates 1.0e-02, token_ids 50% identical rows")
    assert summary.endswith("token_ids 100% same candidates")


def test_a_near_tie_at_the_cutoff_is_not_a_miss():
    """The last candidate replaced by another (a near tie at the cutoff): recall 3/4, 4/4 beyond ties.
    A candidate missed above the cutoff counts as missed; the deploy file's minimum applies."""
    report = beam_report(beam_runner(REF_SEQS[:3] + [[9, 9]], [-1.0, -1.001, -1.502, -2.003]))
    candidates = report["cases"][0]["outputs"]["candidates"]
    assert report["passed"] and candidates["recall"] == 0.75 and candidates["recall_beyond_ties"] == 1.0
    middle = beam_runner([[5, 6], [7, 8], [9, 9], [3, 4]], [-1.0, -1.001, -1.502, -2.003])
    assert beam_report(middle)["passed"]  # 3 of 4: the default minimum
    strict = beam_report(middle, overrides={"recall": 1.0})
    assert not strict["passed"] and strict["tolerances"]["recall"] == 1.0
    assert "recall 0.75 < 1.0" in validate.failure_message(strict)


@pytest.mark.parametrize("seqs,scores,finished,problem", [
    (REF_SEQS, [-1.5, -2.0, -1.0, -1.001], None, "> 0.25 on common candidates"),  # shuffled
    (REF_SEQS, [s - 0.6 for s in REF_SCORES], None, "score error"),  # off by more than bf16 allows
    ([[5, 6], [7, 9], [1, 3], [3, 5]], REF_SCORES, None, "recall 0.5 < 0.75"),  # other sequences
    (REF_SEQS[::-1], REF_SCORES[::-1], None, "not sorted best first"),  # worst first
    (REF_SEQS, REF_SCORES, [False, True, False, False], "another finished flag"),
    (REF_SEQS, [-1.0, -1.001, -1.5, float("nan")], None, "score error nan"),
], ids=["shuffled-scores", "perturbed", "wrong-sequences", "reversed", "finished", "nan"])
def test_a_broken_lowering_fails_in_low_precision(seqs, scores, finished, problem):
    report = beam_report(beam_runner(seqs, scores, finished))
    assert not report["passed"]
    message = validate.failure_message(report)
    assert "disagrees with the bfloat16 eager reference" in message and problem in message, message


def test_low_precision_beams_are_judged_against_the_fp32_reference():
    """With fp32_reference given, a bf16 beam artifact is compared with it (not the bf16 program);
    fp32 artifacts and score programs ignore it."""
    wrong = beam_runner(REF_SEQS, [s - 1 for s in REF_SCORES])
    report = beam_report(beam_runner(NEAR_SEQS, NEAR_SCORES), want=wrong,
                         fp32_reference=beam_runner(REF_SEQS, REF_SCORES))
    assert report["passed"] and report["reference"] == "float32 eager"
    fp32 = beam_report(beam_runner(REF_SEQS, REF_SCORES), "float32", want=beam_runner(REF_SEQS, REF_SCORES),
                       fp32_reference=wrong)
    assert fp32["passed"] and fp32["reference"] == "float32 eager" and fp32["ids_must_match"]


def test_bf16_beam_program_against_fp32_passes_and_a_scrambled_one_fails(tiny_qwen2_dir):
    """The real beam program (random tiny Qwen2, flat distributions: near ties everywhere) in bf16
    against itself in FP32 passes the candidate checks; its scores shuffled within each request
    (a lowering that attaches scores to the wrong candidates) fail them."""
    spec = BeamSpec(width=8, steps=3, max_prompt_tokens=16, stop_token_ids=(5,), max_requests=2)
    fp32, bf16 = (EagerRunner(make_program(load_model(tiny_qwen2_dir, dtype, "cpu"), spec))
                  for dtype in (torch.float32, torch.bfloat16))
    vocab = load_model(tiny_qwen2_dir, torch.float32, "cpu").cfg.vocab_size
    report = validate.validate(bf16, bf16, spec, BEAM_NAMES, "bfloat16", "cpu", vocab, fp32_reference=fp32)
    assert report["passed"], validate.failure_message(report)

    def scrambled(*inputs):
        token_ids, scores, finished, beam_indices = bf16(*inputs)
        flipped = scores.reshape(-1, spec.width).flip(1).reshape(-1)  # best score on the worst candidate
        return token_ids, flipped, finished, beam_indices

    broken = validate.validate(scrambled, bf16, spec, BEAM_NAMES, "bfloat16", "cpu", vocab, fp32_reference=fp32)
    assert not broken["passed"] and "not sorted best first" in validate.failure_message(broken)


def test_fp8_labels_judged_by_argmax_share_and_rank():
    """An FP8 score artifact's labels: one flipped argmax of five fails a 0.9 floor and passes the
    default's; samples ranked in reverse fail the rank correlation whatever the argmax floor."""
    want = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.505, 0.495], [0.7, 0.3], [0.4, 0.6]])
    tolerances = dict(validate.TOLERANCES["bfloat16"], **validate.FP8_TOLERANCES)
    near = want + torch.tensor([[0.01, -0.01], [0.0, 0.0], [-0.01, 0.01], [0.0, 0.0], [0.0, 0.0]])
    ok = validate._compare_labels(near, want, tolerances)  # sample 2 flips on a near tie
    assert ok["passed"] and ok["argmax_agree"] == 0.8 and ok["samples"] == 5, ok
    strict = validate._compare_labels(near, want, dict(tolerances, argmax=0.9))
    assert not strict["passed"] and "argmax agrees on 0.800 of 5 samples" in strict["failed"][0]
    reversed_ = validate._compare_labels(want.flip(0), want, dict(tolerances, argmax=0.0))
    assert not reversed_["passed"] and "rank correlation" in reversed_["failed"][0]
    assert validate._compare_labels(want, want, tolerances)["spearman"] == 1.0


def test_an_fp8_score_program_is_judged_against_the_fp32_program(tiny_qwen3_dir):
    """With fp8, the score artifact is compared with the FP32 program, its labels checked; the real
    FP8 program passes, one whose MLP output is scaled wrongly fails."""
    from boundgen.model import fp8

    spec = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9891, 2152), max_samples=4, max_tokens_per_sample=16,
                     max_total_tokens=48)
    fp32 = EagerRunner(make_program(load_model(tiny_qwen3_dir, torch.float32, "cpu"), spec))
    quantized = EagerRunner(make_program(fp8.quantize(load_model(tiny_qwen3_dir, torch.bfloat16, "cpu"), "mlp"), spec))
    vocab = load_model(tiny_qwen3_dir, torch.float32, "cpu").cfg.vocab_size
    report = validate.validate(quantized, quantized, spec, ("probs",), "bfloat16", "cpu", vocab, fp32_reference=fp32,
                               fp8="mlp")
    assert report["passed"] and report["reference"] == "float32 eager" and report["fp8"] == "mlp"
    assert all("labels" in case["outputs"] for case in report["cases"])
    assert report["tolerances"]["probs"] == validate.FP8_TOLERANCES["probs"]
    overridden = validate.validate(quantized, quantized, spec, ("probs",), "bfloat16", "cpu", vocab,
                                   overrides={"probs": 0.2, "argmax": 0.5}, fp32_reference=fp32, fp8="mlp")
    assert overridden["tolerances"]["probs"] == 0.2 and overridden["tolerances"]["argmax"] == 0.5
    broken_model = fp8.quantize(load_model(tiny_qwen3_dir, torch.bfloat16, "cpu"), "mlp")
    for layer in broken_model.layers:
        layer.mlp.down_proj.weight_scale.mul_(-40)  # a wrong scale: the MLP's output sign-flipped and huge
    broken = validate.validate(EagerRunner(make_program(broken_model, spec)), quantized, spec, ("probs",), "bfloat16",
                               "cpu", vocab, fp32_reference=fp32, fp8="mlp")
    assert not broken["passed"], broken
