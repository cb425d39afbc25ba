"""Program -> `torch.export` graph with bounded dynamic dims.

The program's inputs are packed (see programs/score.py, programs/beam.py); their sizes vary
per request within the spec's bounds, and the export says so:

    score: tokens [T], positions [T], cu_seqlens [B+1]   T in [1, max_total_tokens], B in [1, max_samples + 1]
    beam:  tokens [L], positions [L], cu_seqlens [2]     L in [1, max_prompt_tokens]

B has room for one sequence more than a request may bring: the filler sequence that bucketed
padding appends for CUDA graphs (runtime/graphs.py).

A bound of 1 makes that dim static. Example inputs are synthetic ids with sizes that equal no
other dim (B=2, 3 tokens each), so that export neither specialises a dim to 0/1 nor assumes
two dims equal.
"""

from __future__ import annotations

import torch

from boundgen.programs.spec import BeamSpec, ScoreSpec


def dim_bounds(spec: ScoreSpec | BeamSpec) -> dict[str, tuple[int, int]]:
    """The named dynamic dims of the program's inputs and their [min, max] (the manifest records these)."""
    if spec.task == "score":
        return {"T": (1, spec.max_total_tokens), "B": (1, spec.max_samples + 1)}
    return {"L": (1, spec.max_prompt_tokens)}


def packed_example(lengths: list[int], device, vocab_size: int, seed: int = 0):
    """(tokens [T], positions [T], cu_seqlens [B+1] int32) for samples of the given lengths, random ids."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    tokens = torch.randint(0, vocab_size, (total,), generator=gen, dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return tokens.to(device), positions.to(device), cu_seqlens.to(device)


def example_lengths(spec: ScoreSpec | BeamSpec) -> list[int]:
    if spec.task == "score":
        samples = min(2, spec.max_samples + 1, spec.max_total_tokens)
        per_sample = max(1, min(3, spec.max_tokens_per_sample, spec.max_total_tokens // samples))
        return [per_sample] * samples
    return [min(5, spec.max_prompt_tokens)]


def dynamic_shapes(spec: ScoreSpec | BeamSpec) -> dict:
    bounds = dim_bounds(spec)
    if spec.task == "score":
        t_lo, t_hi = bounds["T"]
        b_lo, b_hi = bounds["B"]
        tokens = {0: torch.export.Dim("T", min=t_lo, max=t_hi)} if t_hi > t_lo else None
        cu = {0: torch.export.Dim("B", min=b_lo, max=b_hi) + 1} if b_hi > b_lo else None
        return {"tokens": tokens, "positions": tokens, "cu_seqlens": cu}
    l_lo, l_hi = bounds["L"]
    tokens = {0: torch.export.Dim("L", min=l_lo, max=l_hi)} if l_hi > l_lo else None
    return {"tokens": tokens, "positions": tokens, "cu_seqlens": None}


def export_program(program: torch.nn.Module, spec: ScoreSpec | BeamSpec, device, vocab_size: int):
    """Trace the program (non-strict) into an ExportedProgram with the spec's bounded dims."""
    inputs = packed_example(example_lengths(spec), device, vocab_size)
    with torch.no_grad():
        return torch.export.export(program, inputs, dynamic_shapes=dynamic_shapes(spec), strict=False)
