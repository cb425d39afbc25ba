"""Build-time validation: the compiled artifact against the eager reference program.

Both run on the build's device and dtype, on the same packed inputs (seeded random token
ids), for a representative request and the boundary shapes of the spec:

    score: one sample of one token; a few samples of mixed lengths; max_samples samples filled
           up to max_tokens_per_sample each within max_total_tokens; one sample of
           max_tokens_per_sample tokens; the mixed samples padded as for CUDA graphs
           (max_total_tokens in all, max_samples + 1 sequences, the last ones empty)
    beam:  a one-token prompt; a representative prompt; a prompt of max_prompt_tokens; with
           max_requests > 1, mixed prompts in one call and max_requests prompts of max_prompt_tokens;
           prompts followed by tokens of no request, as CUDA-graph padding leaves them

Per output the maximum absolute error is recorded against a tolerance (fp32 1e-4; bf16 and
fp16 looser, see TOLERANCES; the deploy file may override per output). Integer outputs
(candidate ids, parent beams, finished flags, top-k ids) must be identical in fp32. Output
dtypes and shapes must always match. The report goes into the manifest; a failure fails the build.

Beam artifacts in bf16 / fp16 are judged against the FP32 eager program (`fp32_reference`; the
same-dtype reference when none is given) on what the user consumes, each request's W candidate
sequences with their scores, and not row by row: a low-precision model reorders candidates whose
scores are closer than its error (random weights make flat distributions where most are), and
which of two near-equal candidates wins is luck, not correctness. Per request (empty slots of
the finished set, score <= NEG / 2, left out), with e the request's largest score error on the
common candidates and a near tie = reference scores within TIE_BAND x e:
    recall_beyond_ties  share of the reference's candidates the artifact returned, or missed
                        at the cutoff by a near tie (plain `recall` recorded too)  >= "recall"
    top1      the artifact's first is the reference's, or a near tie of it: the share of all
              requests of all cases (report["top1"])                             >= "top1"
    best_first          the artifact's scores do not increase down the rows        every request
    spearman  rank correlation of the two scores over the common candidates      >= "spearman"
    scores    max |score - reference score| over the common candidates (e)       <= "scores"
    ranked_scores       max |i-th best score - the reference's i-th best|         <= "scores"
    finished  the same flag for every common candidate                            every one
Near ties decide more than the cutoff: a near tie among partial hypotheses at an early step
swaps whole subtrees, whose descendants may score anywhere above the final cutoff (and may
even become the best), so recall and top-1 agreement below 1 are expected and their default
minimums are floors against wrong sequences; what must hold tightly is the score of each
returned candidate and the score profile rank for rank. Measured, bf16 against FP32 on random
checkpoints (CPU): a Qwen2.5-0.5B-shaped model at W = 100, N_gen = 5: recall 0.90-0.93 (0.99-1.0
beyond ties), spearman 0.97-0.99, score error 0.04-0.08, rank-for-rank 0.03-0.05; a tiny Qwen2 at
W = 8: recall >= 0.75, one top-1 of 9 requests another candidate. A wrong lowering fails on scores
(wrong values, or scores on the wrong candidates), spearman (scrambled), recall (other
sequences) or best_first (order). The thresholds are TOLERANCES' (recall, spearman and top1 are
minimums), overridable by the deploy file's "tolerances".

FP8 builds (`--fp8 mlp`, model/fp8.py) are judged against the FP32 eager program too, with
FP8_TOLERANCES over the dtype's: for a score artifact the label probabilities' max abs error, and
per case (the "labels" entry) the share of samples whose label argmax agrees (`argmax`, a
minimum: a flip on a near tie is luck, so the default is a floor below 1) and the rank
correlation of the first label's probability over the samples (`spearman`, a minimum). The report keeps the per-output
entries too (token_ids: identical, candidate_overlap = recall; scores: the error on common
candidates), so tools reading them keep working.
"""

from __future__ import annotations

import math
import time
import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.tasks import Case, task_of
from boundgen.artifact.tensors import Trie, call_trie
from boundgen.compile.export import packed_example
from boundgen.errors import BoundgenError

# Max abs error per float output, by compute dtype. bf16 carries ~3 significant digits: label
# probabilities move by ~1e-2, a beam score (sum of N_gen log-probs over a 152k vocabulary,
# about -12 each) by ~1e-1. Beam candidates in low precision against FP32: "recall", "spearman"
# and "top1" are minimums, "scores" the max error of a candidate's score (module docstring).
# The score program's lse and label_logits (log space, FP32 of model-dtype logits) move as a beam
# score's single step does: a logit error of e is a relative error of ~e in a probability.
TOLERANCES = {
    "float32": {"probs": 1e-4, "topk_probs": 1e-4, "scores": 1e-4, "lse": 1e-4, "label_logits": 1e-4},
    "float16": {"probs": 5e-3, "topk_probs": 5e-3, "scores": 5e-2, "lse": 5e-2, "label_logits": 5e-2,
                "recall": 0.75, "spearman": 0.5, "top1": 0.5},
    "bfloat16": {"probs": 2e-2, "topk_probs": 2e-2, "scores": 2.5e-1, "lse": 2.5e-1, "label_logits": 2.5e-1,
                 "recall": 0.75, "spearman": 0.5, "top1": 0.5},
}
# FP8 builds against the FP32 program, over the dtype's (module docstring). E4M3 keeps 3 mantissa
# bits: a GEMM's output carries ~28 dB SQNR (bench.gemms), label probabilities move by a few 1e-2;
# logits (unbounded, ~10-30 on real checkpoints) by a few 1e-1, so theirs is a floor against gross errors.
FP8_TOLERANCES = {"probs": 6e-2, "topk_probs": 6e-2, "lse": 1.0, "label_logits": 1.0, "argmax": 0.75,
                  "spearman": 0.5}
DEFAULT_TOKEN_BUCKET = RuntimeConfig().token_bucket
EXACT_OUTPUTS = ("token_ids", "beam_indices", "finished", "topk_ids")
EMPTY_SCORE = -0.5e9  # finished-set slots below this hold no hypothesis (programs/beam.py: NEG = -1e9)
# Two candidates whose reference scores differ by less than TIE_BAND x the request's largest score
# error on common candidates are a near tie: which one makes the cut is not a defect.
TIE_BAND = 4.0


class ValidationFailed(BoundgenError):
    """The compiled program disagrees with the eager reference beyond tolerance."""


def cases(spec, token_bucket: int = DEFAULT_TOKEN_BUCKET) -> list[Case]:
    """The validation cases of `spec` (its task's, artifact/tasks.py); `token_bucket` is the padding
    granule of CUDA-graph shapes (a score call's filler sequence is shorter than it, runtime/graphs.py)."""
    unique, seen = [], set()
    for case in task_of(spec).validation_cases(spec, token_bucket):  # tiny bounds make some cases coincide
        if (case.lengths, case.tail) not in seen:
            unique.append(case)
            seen.add((case.lengths, case.tail))
    return unique


def validate(compiled, reference, spec, output_names: tuple[str, ...], dtype: str, device: str, vocab_size: int,
             overrides: dict | None = None, fp32_reference=None, token_bucket: int = DEFAULT_TOKEN_BUCKET,
             fp8: str = "none", trie: tuple = (), suffix: str = "") -> dict:
    """Run every case through both runners; return the report (see module docstring).
    fp32_reference: the FP32 eager program, the reference of a low-precision beam artifact and of
    an FP8 one (`fp8` other than "none"). trie: a constrained artifact's TRIE inputs, given to the
    compiled runner only (the references hold the same catalogue); suffix: appended to case names."""
    quantized = fp8 != "none"
    tolerances = {**TOLERANCES[dtype], **(FP8_TOLERANCES if quantized else {}), **(overrides or {})}
    exact_required = dtype == "float32"
    judged_by = task_of(spec).judged_by(exact_required, quantized)
    by_candidates, by_labels = judged_by == "candidates", judged_by == "labels"
    if (by_candidates or by_labels) and fp32_reference is not None:
        reference, against = fp32_reference, "float32 eager"
    else:
        against = f"{dtype} eager"
    report = {"passed": True, "dtype": dtype, "fp8": fp8, "reference": against, "tolerances": tolerances,
              "ids_must_match": exact_required, "cases": []}
    for i, case in enumerate(cases(spec, token_bucket)):
        inputs = packed_example(list(case.lengths), device, vocab_size, seed=1000 + i, tail=case.tail)
        rows = call_trie([Trie(*trie)] * (inputs[2].shape[0] - 1)) if trie else ()  # an allow-list row a prompt
        got, got_s = _timed(compiled, tuple(inputs) + tuple(rows), device)
        want, want_s = _timed(reference, inputs, device)
        outputs = {}
        for name, g, w in zip(output_names, got, want):
            outputs[name] = _compare(name, g, w, tolerances, exact_required)
        if len(got) != len(want):
            outputs["outputs"] = {"passed": False, "problem": f"{len(got)} outputs, the reference has {len(want)}"}
        elif by_candidates and all(o.get("problem") is None for o in outputs.values()):
            judged = _compare_candidates(dict(zip(output_names, got)), dict(zip(output_names, want)), spec.width,
                                         tolerances)
            outputs.update({name: {**outputs.get(name, {}), **entry} for name, entry in judged.items()})
        elif by_labels and "probs" in outputs and outputs["probs"].get("problem") is None:
            names = list(output_names)
            outputs["labels"] = _compare_labels(got[names.index("probs")], want[names.index("probs")], tolerances)
        passed = all(o["passed"] for o in outputs.values())
        report["cases"].append({"name": case.name + suffix, "samples": len(case.lengths), "tokens": sum(case.lengths) + case.tail,
                                "outputs": outputs, "passed": passed,
                                "seconds": {"compiled": round(got_s, 4), "eager": round(want_s, 4)}})
        report["passed"] &= passed
    if by_candidates:  # top-1 agreement over every request of every case (one flips by luck: see docstring)
        top1 = [t for case in report["cases"] for t in case["outputs"].get("candidates", {}).get("top1", [])]
        share = sum(top1) / max(1, len(top1))
        report["top1"] = {"requests": len(top1), "agree": round(share, 6), "minimum": tolerances["top1"],
                          "passed": share >= tolerances["top1"]}
        report["passed"] &= report["top1"]["passed"]
    return report


def merge(report: dict, more: dict) -> dict:
    """Two reports of one artifact (a constrained one's rounds with and without an allow-list) as one."""
    out = {**report, "cases": report["cases"] + more["cases"], "passed": report["passed"] and more["passed"]}
    if "top1" in report and "top1" in more:
        a, b = report["top1"], more["top1"]
        requests = a["requests"] + b["requests"]
        share = (a["agree"] * a["requests"] + b["agree"] * b["requests"]) / max(1, requests)
        out["top1"] = {**a, "requests": requests, "agree": round(share, 6), "passed": share >= a["minimum"]}
        out["passed"] &= out["top1"]["passed"]
    return out


def failure_message(report: dict) -> str:
    lines = []
    for case in report["cases"]:
        for name, o in case["outputs"].items():
            if not o["passed"]:
                if o.get("problem"):
                    detail = o["problem"]
                elif "failed" in o:  # the candidate checks of a low-precision beam
                    detail = "; ".join(o["failed"])
                elif "identical" in o:  # ids, or an output that must match exactly
                    detail = f"not identical ({o['identical_rows']:.1%} of rows are)"
                else:
                    detail = f"max abs error {o['max_abs_err']} > tolerance {o['tolerance']}"
                lines.append(f"  {case['name']} ({case['samples']} samples, {case['tokens']} tokens): {name}: {detail}")
    top1 = report.get("top1")
    if top1 and not top1["passed"]:
        lines.append(f"  top-1 agreement: {top1['agree']} of {top1['requests']} requests < {top1['minimum']} (the "
                     f"artifact's best candidate is the reference's, or a near tie of it)")
    against = report.get("reference", "eager")
    return f"compiled artifact disagrees with the {against} reference:\n" + "\n".join(lines)


def _timed(runner, inputs, device):
    start = time.perf_counter()
    with torch.inference_mode():
        out = runner(*inputs)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return [t.detach() for t in out], time.perf_counter() - start


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, tolerances: dict, exact_required: bool) -> dict:
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        return {"passed": False, "problem": f"compiled gives {got.dtype} {list(got.shape)}, "
                                            f"the reference {want.dtype} {list(want.shape)}"}
    if name in EXACT_OUTPUTS or not got.is_floating_point():
        same_rows = (got == want).reshape(got.shape[0], -1).all(dim=1) if got.dim() else (got == want).reshape(1)
        identical = bool(same_rows.all())
        out = {"identical": identical, "identical_rows": round(float(same_rows.float().mean()), 6),
               "passed": identical or not exact_required}
        if name == "token_ids":  # the same candidates, maybe in another order after a near tie
            rows_got, rows_want = set(map(tuple, got.tolist())), set(map(tuple, want.tolist()))
            out["candidate_overlap"] = round(len(rows_got & rows_want) / max(1, len(rows_want)), 6)
        return out
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    tol = tolerances.get(name, tolerances.get("probs"))
    ok = math.isfinite(err) and err <= tol
    return {"max_abs_err": err if math.isfinite(err) else str(err), "tolerance": tol, "passed": ok}


def _compare_candidates(got: dict, want: dict, width: int, tolerances: dict) -> dict:
    """Low-precision beam outputs against the reference's, per request (module docstring): the
    "candidates" entry, and token_ids / scores entries judged on the candidate sets."""
    score_tol = tolerances["scores"]
    recall, tie_recall, spearman, errors, profile, top1, ordered, finished = [], [], [], [], [], [], [], 0
    for r in range(got["token_ids"].shape[0] // width):
        rows = slice(r * width, (r + 1) * width)
        mine, ref = _candidates(got, rows), _candidates(want, rows)
        common = [seq for seq in ref if seq in mine]
        request_errors = [abs(mine[seq][0] - ref[seq][0]) for seq in common]
        band = TIE_BAND * _worst(request_errors) + 1e-6  # scores closer than this: a near tie
        cutoff = min((v[0] for v in ref.values()), default=0.0)
        near_cutoff = [seq for seq in ref if seq not in mine and ref[seq][0] - cutoff <= band]
        recall.append(len(common) / max(1, len(ref)))
        tie_recall.append((len(common) + len(near_cutoff)) / max(1, len(ref)))
        errors += request_errors
        finished += sum(mine[seq][1] != ref[seq][1] for seq in common)
        spearman.append(_spearman([ref[seq][0] for seq in common], [mine[seq][0] for seq in common]))
        first_mine, first_ref = next(iter(mine), None), next(iter(ref), None)
        top1.append(first_mine == first_ref or (first_mine in ref and ref[first_ref][0] - ref[first_mine][0] <= band))
        scores = [v[0] for v in mine.values()]
        ordered.append(all(a >= b for a, b in zip(scores, scores[1:])))
        ranked = sorted((v[0] for v in ref.values()), reverse=True)
        profile += [abs(a - b) for a, b in zip(sorted(scores, reverse=True), ranked)]
        if len(scores) != len(ranked):
            profile.append(float("inf"))  # another number of hypotheses
    err, profile_err = _worst(errors), _worst(profile)
    out = {"recall": round(min(recall, default=1.0), 6), "recall_beyond_ties": round(min(tie_recall, default=1.0), 6),
           "top1": [bool(t) for t in top1], "best_first": all(ordered),
           "spearman": round(min(spearman, default=1.0), 6),
           "scores_max_abs_err": err if math.isfinite(err) else str(err),
           "max_abs_err": err if math.isfinite(err) else str(err),  # what build progress and reports show
           "ranked_scores_max_abs_err": profile_err if math.isfinite(profile_err) else str(profile_err),
           "finished_mismatches": finished,
           "thresholds": {"recall": tolerances["recall"], "spearman": tolerances["spearman"], "scores": score_tol}}
    failed = []
    if not out["recall_beyond_ties"] >= tolerances["recall"]:
        failed.append(f"recall {out['recall_beyond_ties']} < {tolerances['recall']} of the reference's candidates "
                      f"(near ties at the cutoff forgiven)")
    if not out["best_first"]:
        failed.append("candidates are not sorted best first")
    if not out["spearman"] >= tolerances["spearman"]:
        failed.append(f"score rank correlation {out['spearman']} < {tolerances['spearman']} on common candidates")
    if not (math.isfinite(err) and err <= score_tol):
        failed.append(f"score error {err} > {score_tol} on common candidates")
    if not (math.isfinite(profile_err) and profile_err <= score_tol):
        failed.append(f"score error {profile_err} > {score_tol} rank for rank (i-th best against i-th best)")
    if finished:
        failed.append(f"{finished} common candidates with another finished flag")
    out.update(passed=not failed, failed=failed)
    token_ids = {"identical": torch.equal(got["token_ids"], want["token_ids"]), "candidate_overlap": out["recall"],
                 "passed": True}
    scores = {"max_abs_err": out["scores_max_abs_err"], "tolerance": score_tol, "on": "common candidates",
              "passed": math.isfinite(err) and err <= score_tol}
    return {"candidates": out, "token_ids": token_ids, "scores": scores}


def _compare_labels(got: torch.Tensor, want: torch.Tensor, tolerances: dict) -> dict:
    """A quantized score artifact's label probabilities [B, C] against the FP32 reference's: the
    share of samples whose label argmax agrees, the rank correlation of the first label's
    probability over the samples (module docstring)."""
    finite = torch.isfinite(got).all(dim=1) & torch.isfinite(want).all(dim=1)
    got, want = got[finite].double(), want[finite].double()
    err = _worst((got - want).abs().flatten().tolist())
    agree = got.argmax(dim=1) == want.argmax(dim=1)
    share = float(agree.double().mean()) if len(agree) else 1.0
    rho = _spearman(want[:, 0].tolist(), got[:, 0].tolist()) if len(want) >= 3 else 1.0
    out = {"samples": int(finite.sum()), "argmax_agree": round(share, 6), "spearman": round(rho, 6),
           "max_abs_err": err if math.isfinite(err) else str(err),
           "thresholds": {"argmax": tolerances["argmax"], "spearman": tolerances["spearman"]}}
    failed = []
    if not share >= tolerances["argmax"]:
        failed.append(f"label argmax agrees on {share:.3f} of {len(agree)} samples < {tolerances['argmax']}")
    if not rho >= tolerances["spearman"]:
        failed.append(f"rank correlation of the first label's probability {rho:.3f} < {tolerances['spearman']}")
    return dict(out, passed=not failed, failed=failed)


def _worst(errors: list[float]) -> float:
    """The largest error; NaN if any is (max() would skip it by position)."""
    return float("nan") if any(e != e for e in errors) else max(errors, default=0.0)


def _candidates(outputs: dict, rows: slice) -> dict[tuple, tuple[float, bool]]:
    """One request's candidate sequences -> (score, finished), empty finished-set slots left out."""
    seqs, scores = outputs["token_ids"][rows].tolist(), outputs["scores"][rows].double().tolist()
    flags = outputs["finished"][rows].tolist() if "finished" in outputs else [False] * len(seqs)
    return {tuple(seq): (score, flag) for seq, score, flag in zip(seqs, scores, flags)
            if not score <= EMPTY_SCORE}  # NaN kept: it must fail the score checks


def _spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation with tied values at their mean rank; 1.0 for fewer than two values or no spread."""
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    if len(a) < 2:
        return 1.0
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.square().sum() * rb.square().sum()).sqrt()
    return 1.0 if denom == 0 else float((ra * rb).sum() / denom)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for value in torch.unique(x):  # ties: the mean of their ranks
        same = x == value
        ranks[same] = ranks[same].mean()
    return ranks
