"""Program -> `torch.export` graphs with bounded dynamic dims, one per package.

The program's inputs are packed (see programs/score.py, programs/beam.py); their sizes vary
per request within the spec's bounds, and the export says so:

    score "model": tokens [T], positions [T], cu_seqlens [B+1]   T in [1, max_total_tokens], B in [1, max_samples + 1]
    beam "prefill": tokens [L], positions [L], cu_seqlens [R+1]   L in [1, max_prompt_tokens x max_requests],
                                                                  R in [1, max_requests]
    beam "step":    step [1], prefix_k/prefix_v [layers, L, ...], cu_seqlens [R+1], suffix_k/v [layers, R*W, ...],
                    the search state [R, ...]
    beam "finish":  the search state [R, ...]
    constrained beam: every stage also takes the TRIE tensors (artifact/tensors.py), [M] and
                    reach, ends [R, M] (a row per request), M in [MIN_NODES + 1, inf); traced on
                    `example_catalogue`

B has room for one sequence more than a request may bring: the filler sequence that bucketed
padding appends for CUDA graphs (runtime/graphs.py). The beam stages' example inputs are what
the eager stages produce from the example prompts, so each stage is traced on real state.
Example sizes double as Inductor's tuning hints (`example_lengths`).

A bound of 1 makes that dim static. Example inputs are synthetic ids with sizes that equal no
other dim, so that export neither specialises a dim to 0/1 nor assumes two dims equal.
"""

from __future__ import annotations

import numpy as np
import torch

from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import BEAM_STATE, FILTERS, SCORE_PACKAGE, TRIE, Trie, call_trie
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue


def dim_bounds(spec: ScoreSpec | BeamSpec) -> dict[str, tuple[int, int]]:
    """The named dynamic dims of the program's inputs and their [min, max] (the manifest records these)."""
    return task_of(spec).dim_bounds(spec)


def packed_example(lengths: list[int], device, vocab_size: int, seed: int = 0, tail: int = 0):
    """(tokens [T], positions [T], cu_seqlens [B+1] int32) for samples of the given lengths, random ids;
    `tail` more tokens after the last sample belong to none (a beam call padded for CUDA graphs)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths) + tail
    tokens = torch.randint(0, vocab_size, (total,), generator=gen, dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in (*lengths, tail)])
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return tokens.to(device), positions.to(device), cu_seqlens.to(device)


def example_lengths(spec: ScoreSpec | BeamSpec) -> list[int]:
    """Sample lengths of the example the program is traced on (its task's, artifact/tasks.py).

    The example's sizes are also the size hints Inductor tunes its kernels for (block sizes of
    pointwise and reduction kernels), so score examples are representative of real calls (up
    to 15 samples of half the per-sample bound), not tiny; beam examples are up to 3 short
    prompts. Two dims never take equal sizes (export would be free to assume them
    equal), and R, B >= 2 (export specialises a dim whose example size is 1)."""
    return task_of(spec).example_lengths(spec)


def named_dims(spec: ScoreSpec | BeamSpec) -> dict[str, "torch.export.Dim | None"]:
    """The export Dim of each name in `dim_bounds` (None where the bound makes it static)."""
    dims = {}
    for name, (lo, hi) in dim_bounds(spec).items():
        if hi > lo:
            # Export assumes a dynamic size is >= 2 (0/1 specialisation), so a dim in [1, 2] (R of
            # max_requests 2; B of max_samples 1, whose calls add a filler sequence) would be pinned
            # to 2, and the build failed; a range up to 3 keeps it symbolic. Calls never hold more
            # than the spec's bounds (the runtime's checks).
            hi = max(hi, 3)
        dims[name] = torch.export.Dim(name, min=lo, max=hi) if hi > lo else None
    return dims


def dynamic_shapes(spec: ScoreSpec | BeamSpec, dims: dict | None = None) -> dict:
    """The dynamic shapes of the packed inputs (score program, beam prefill), by argument name;
    `dims` from named_dims, when the caller uses the same Dim objects elsewhere."""
    dims = dims or named_dims(spec)
    task = task_of(spec)
    tokens_dim, seqs_dim = dims[task.tokens_dim], dims[task.sequences_dim]
    tokens = {0: tokens_dim} if tokens_dim is not None else None
    cu = {0: seqs_dim + 1} if seqs_dim is not None else None
    return {"tokens": tokens, "positions": tokens, "cu_seqlens": cu}


def example_catalogue(spec: BeamSpec, vocab_size: int, items: int = 40, seed: int = 0) -> Catalogue:
    """A catalogue of `items` random codes of spec.steps tokens (no stop token), sharing a few first
    tokens: what a constrained program is traced and validated on. Its node count is chosen
    away from the other dims' example sizes (module docstring)."""
    gen = np.random.default_rng(seed)
    tokens = np.setdiff1d(np.arange(min(vocab_size, 4096)), np.asarray(spec.stop_token_ids, dtype=np.int64))
    taken = {spec.width, spec.steps, spec.max_requests, spec.max_prompt_tokens}
    while True:
        codes = {tuple(gen.choice(tokens[:3], 1).tolist() + gen.choice(tokens, spec.steps - 1).tolist())
                 for _ in range(items)}
        cat = Catalogue.from_sequences(range(len(codes)), [list(c) for c in sorted(codes)])
        if max(cat.num_nodes, catalogue_search.MIN_NODES) + 1 not in taken:
            return cat
        items += 1


def trie_tensors(arrays: dict[str, np.ndarray], device) -> Trie:
    """The TRIE arrays (text/catalogue_search.py) as tensors on the device, in TRIE order, all [M]
    (one request's: a call takes `call_trie` of its requests')."""
    return Trie(*(torch.from_numpy(arrays[name]).to(device) for name in TRIE))


def export_programs(program: torch.nn.Module, spec: ScoreSpec | BeamSpec, device,
                    vocab_size: int) -> dict[str, torch.export.ExportedProgram]:
    """Trace the program (non-strict) into ExportedPrograms with the spec's bounded dims, by
    package name: {"model": ...} for score, the three beam stages for beam."""
    inputs = packed_example(example_lengths(spec), device, vocab_size)
    with torch.no_grad():
        return EXPORTS[spec.task](program, spec, inputs)


def _export_score(program, spec: ScoreSpec, inputs) -> dict[str, torch.export.ExportedProgram]:
    return {SCORE_PACKAGE: torch.export.export(program, inputs, dynamic_shapes=dynamic_shapes(spec), strict=False)}


def _trie_shapes(requests) -> tuple[dict, ...]:
    """requests: the R Dim (None where static)."""
    nodes = torch.export.Dim("M", min=catalogue_search.MIN_NODES + 1)
    return tuple({0: requests, 1: nodes} if name in FILTERS else {0: nodes} for name in TRIE)


def _export_beam_stages(program, spec: BeamSpec, inputs) -> dict[str, torch.export.ExportedProgram]:
    """The three stages; a constrained program's also take the trie (traced on `example_catalogue`)."""
    trie = ()
    if spec.constrained:
        vocab = program.model.cfg.vocab_size
        one = trie_tensors(catalogue_search.arrays(example_catalogue(spec, vocab), vocab), inputs[0].device)
        trie = call_trie([one] * (inputs[2].shape[0] - 1))  # the example's prompts, a row each
    stages = program.stages()
    dims = named_dims(spec)
    r = dims["R"]  # None where static
    inputs_shapes = dynamic_shapes(spec, dims)
    prompt, cu = inputs_shapes["tokens"], inputs_shapes["cu_seqlens"]
    prefix = {1: prompt[0]} if prompt else None
    requests = {0: r} if r is not None else None
    beams = {1: spec.width * r} if r is not None else None  # suffix K/V rows: R * W
    trie_shapes = _trie_shapes(r) if trie else ()
    state = stages["prefill"](*inputs, *trie)  # prefix_k, prefix_v, suffix_k, suffix_v, *state
    step_inputs = (torch.zeros(1, dtype=torch.int64, device=inputs[0].device), state[0], state[1], inputs[2],
                   *trie, *state[2:])
    finish_inputs = (*trie, *(state[4:] if spec.steps == 1 else stages["step"](*step_inputs)[2:]))
    state_dims = (requests,) * len(BEAM_STATE)  # every state tensor leads with R
    shapes = {"prefill": (inputs + tuple(trie), (prompt, prompt, cu) + trie_shapes),
              "step": (step_inputs, (None, prefix, prefix, cu) + trie_shapes + (beams, beams) + state_dims),
              "finish": (finish_inputs, trie_shapes + state_dims)}
    return {name: torch.export.export(stages[name], args, dynamic_shapes=(shape,), strict=False)
            for name, (args, shape) in shapes.items()}


EXPORTS = {"score": _export_score, "beam": _export_beam_stages}  # by task name (artifact/tasks.py)
