"""What the bench does per task, in one place, by task name (the tasks themselves: artifact/tasks.py).

A workload (bench/workloads.py) names its task; its requests' work in FLOPs, the results a client
reads back from output tensors, the HF peer's calls and shapes, and what must match between a
workload and the engine it runs on differ by task, and are chosen here, `BENCH_TASKS[spec.task]`.
Requests reach an engine through the task itself (`task_of(spec).call`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from boundgen.artifact.tasks import TASKS
from boundgen.bench import mfu
from boundgen.runtime.results import BeamResult, ScoreResult


@dataclass(frozen=True)
class BenchTask:
    flops: Callable  # (model shape, workload, request) -> mfu.RequestFlops
    result: Callable  # output arrays by name (BYTES as lists of bytes) -> ScoreResult | BeamResult
    peer_batch: Callable  # (HF peer, workload) -> (requests -> results, in one model call)
    peer_shape: Callable  # (HF peer, request) -> the length that decides the peer's compiled shape
    check: Callable  # workload -> None; ValueError naming what a workload of the task lacks
    mismatch: Callable  # (engine program spec, workload) -> what differs (the two do different work), or None
    peer_pads_samples: bool  # the peer pads samples to each other (the paddings are probed)
    peer_compiled_one_request: bool  # the compiled peer runs one request a call (bench/peer_compiled.py)
    diagnostic: bool  # the framework-overhead diagnostic applies (bench/diagnostic.py)
    describe: Callable  # a workload's dict form (a result file's "workload") -> its shape, in words


def _score_result(outs: dict) -> ScoreResult:
    return ScoreResult(scores=outs["SCORES"], label_token_ids=[])


def _beam_result(outs: dict) -> BeamResult:
    ids = outs["TOKEN_IDS"].astype(np.int32)
    return BeamResult(token_ids=ids, scores=outs["SCORES"], finished=(ids < 0).any(axis=1),
                      texts=[b.decode("utf-8", errors="replace") for b in outs.get("TEXT_OUT", [])],
                      item_ids=outs.get("ITEM_IDS"))  # a constrained model's


def _score_peer_batch(peer, spec):
    label_ids = peer.label_token_ids(spec.labels)
    return lambda requests: peer.score_batch([r.texts for r in requests], label_ids)


def _beam_peer_batch(peer, spec):
    return lambda requests: peer.beam_batch([r.texts[0] for r in requests], spec.width, spec.steps)


def _score_check(spec) -> None:
    pass


def _beam_check(spec) -> None:
    if spec.samples != 1 or spec.width <= 0 or spec.steps <= 0:
        raise ValueError("a beam workload has one sample per request and positive width and steps")


def _score_mismatch(program, spec) -> str | None:
    if tuple(program.labels) != tuple(spec.labels):
        return f"engine labels {list(program.labels)} differ from {spec.name}'s {list(spec.labels)}"
    return None


def _beam_mismatch(program, spec) -> str | None:
    if (program.width, program.steps) != (spec.width, spec.steps):
        return (f"engine W={program.width} N_gen={program.steps} differ from {spec.name}'s W={spec.width} "
                f"N_gen={spec.steps}: boundgen and the peer do not do the same work")
    return None


BENCH_TASKS = {
    "score": BenchTask(flops=lambda shape, spec, request: mfu.score_flops(shape, request.token_counts),
                       result=_score_result, peer_batch=_score_peer_batch,
                       peer_shape=lambda peer, request: peer.padded_length(request.token_counts),
                       check=_score_check, mismatch=_score_mismatch, peer_pads_samples=True,
                       peer_compiled_one_request=False, diagnostic=True,
                       describe=lambda wl: (f"{wl.get('samples')} samples x {wl.get('min_tokens')}-"
                                            f"{wl.get('max_tokens')} tokens, labels {wl.get('labels')}")),
    "beam": BenchTask(flops=lambda shape, spec, request: mfu.beam_flops(shape, request.token_counts[0], spec.width,
                                                                         spec.steps),
                      result=_beam_result, peer_batch=_beam_peer_batch,
                      peer_shape=lambda peer, request: request.token_counts[0],
                      check=_beam_check, mismatch=_beam_mismatch, peer_pads_samples=False,
                      peer_compiled_one_request=True, diagnostic=False,
                      describe=lambda wl: (f"prompt {wl.get('min_tokens')} tokens, W={wl.get('width')}, "
                                           f"N_gen={wl.get('steps')}")),
}
assert set(BENCH_TASKS) == set(TASKS)


def bench_task(name: str) -> BenchTask:
    if name not in BENCH_TASKS:
        raise ValueError(f"task must be {' or '.join(map(repr, BENCH_TASKS))}, got {name!r}")
    return BENCH_TASKS[name]
