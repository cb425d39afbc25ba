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
(candidate ids, parent beams, finished flags, top-k ids) must be identical in fp32; in lower
precision a near tie may flip between two candidates, so only the share of identical rows is
recorded (and, for candidates, the share of the reference's candidate sequences that the
compiled program found too), and the sorted scores must agree within tolerance. Output
dtypes and shapes must always match. The report goes into the manifest; a failure fails the build.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from boundgen.compile.export import packed_example
from boundgen.errors import BoundgenError

# Max abs error per float output, by compute dtype. bf16 carries ~3 significant digits: label
# probabilities move by ~1e-2, a beam score (sum of N_gen log-probs over a 152k vocabulary,
# about -12 each) by ~1e-1.
TOLERANCES = {
    "float32": {"probs": 1e-4, "topk_probs": 1e-4, "scores": 1e-4},
    "float16": {"probs": 5e-3, "topk_probs": 5e-3, "scores": 5e-2},
    "bfloat16": {"probs": 2e-2, "topk_probs": 2e-2, "scores": 2.5e-1},
}
EXACT_OUTPUTS = ("token_ids", "beam_indices", "finished", "topk_ids")


class ValidationFailed(BoundgenError):
    """The compiled program disagrees with the eager reference beyond tolerance."""


@dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]  # tokens per sample (beam: the prompt)
    tail: int = 0  # tokens after the last sample, of no sample (beam padding, runtime/graphs.py)


def cases(spec) -> list[Case]:
    if spec.task == "beam":
        longest = spec.max_prompt_tokens
        typical = min(64, max(1, longest // 2))
        out = [Case("one_token_prompt", (1,)), Case("representative", (typical,)), Case("max_prompt", (longest,))]
        if spec.max_requests > 1:  # several prompts in one call, each request's rows as if alone
            out += [Case("several_requests", (typical, 1, longest)[: spec.max_requests]),
                    Case("max_requests_max_prompt", (longest,) * spec.max_requests)]
        padded = (typical, 1)[: spec.max_requests]
        tail = min(7, spec.call_max_tokens - sum(padded))
        if tail > 0:
            out.append(Case("padded_for_cuda_graphs", padded, tail))
    else:
        per, total, most = spec.max_tokens_per_sample, spec.max_total_tokens, spec.max_samples
        mixed = [max(1, min(per, n)) for n in (per // 2, 1, per, per // 3)[: min(most, 4)]]
        while sum(mixed) > total:  # shrink the longest sample, then drop samples
            longest = mixed.index(max(mixed))
            if mixed[longest] > 1:
                mixed[longest] //= 2
            else:
                mixed.pop()
        # Bucketed padding for CUDA graphs (runtime/graphs.py): one filler sequence, then empty ones.
        filler = total - sum(mixed)
        padded = tuple(mixed) + (filler,) + (0,) * (most - len(mixed))
        out = [Case("one_sample_one_token", (1,)), Case("representative", tuple(mixed)),
               Case("max_samples_max_tokens", _fill(most, per, total)),
               Case("one_sample_max_tokens", (min(per, total),)), Case("padded_for_cuda_graphs", padded)]
    unique, seen = [], set()
    for case in out:  # tiny bounds make some cases coincide
        if (case.lengths, case.tail) not in seen:
            unique.append(case)
            seen.add((case.lengths, case.tail))
    return unique


def _fill(samples: int, per_sample: int, total: int) -> tuple[int, ...]:
    """As many samples (<= `samples`) as fit, as long as possible, within `total` tokens."""
    samples = min(samples, total)
    lengths = [1] * samples
    budget = total - samples
    for i in range(samples):
        add = min(per_sample - 1, budget)
        lengths[i] += add
        budget -= add
    return tuple(lengths)


def validate(compiled, reference, spec, output_names: tuple[str, ...], dtype: str, device: str, vocab_size: int,
             overrides: dict | None = None) -> dict:
    """Run every case through both runners; return the report (see module docstring)."""
    tolerances = dict(TOLERANCES[dtype], **(overrides or {}))
    exact_required = dtype == "float32"
    report = {"passed": True, "dtype": dtype, "tolerances": tolerances, "ids_must_match": exact_required,
              "cases": []}
    for i, case in enumerate(cases(spec)):
        inputs = packed_example(list(case.lengths), device, vocab_size, seed=1000 + i, tail=case.tail)
        got, got_s = _timed(compiled, inputs, device)
        want, want_s = _timed(reference, inputs, device)
        outputs = {}
        for name, g, w in zip(output_names, got, want):
            outputs[name] = _compare(name, g, w, tolerances, exact_required)
        if len(got) != len(want):
            outputs["outputs"] = {"passed": False, "problem": f"{len(got)} outputs, the reference has {len(want)}"}
        passed = all(o["passed"] for o in outputs.values())
        report["cases"].append({"name": case.name, "samples": len(case.lengths), "tokens": sum(case.lengths) + case.tail,
                                "outputs": outputs, "passed": passed,
                                "seconds": {"compiled": round(got_s, 4), "eager": round(want_s, 4)}})
        report["passed"] &= passed
    return report


def failure_message(report: dict) -> str:
    lines = []
    for case in report["cases"]:
        for name, o in case["outputs"].items():
            if not o["passed"]:
                detail = o.get("problem") or f"max abs error {o['max_abs_err']} > tolerance {o['tolerance']}"
                lines.append(f"  {case['name']} ({case['samples']} samples, {case['tokens']} tokens): {name}: {detail}")
    return "compiled artifact disagrees with the eager reference:\n" + "\n".join(lines)


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
