"""Constrained decoding's own costs over a random catalogue: build, load, and each beam step's
constraint (the node walk, the mask) and a request's allow-list, per implementation.

Catalogues: `items` random codes of `code_length` tokens over a code vocabulary of `code_vocab`
tokens (issue 32's 1M and 10M 4-token codes over 32k tokens: semantic IDs, shallow and wide),
built in memory by text/catalogue.py's `Catalogue.from_sequences`: its time, and its peak of
Python/numpy allocations (tracemalloc; the input lists not counted) and the index's size, per
million items. Then the constraint as the beam program holds it (programs/constraint.py's
CatalogueConstraint, N = code_length + 1 steps, one stop token past the code vocabulary): its
construction on the host and its copy to the device, and its buffers' bytes.

A step at B beams over the vocabulary V (Qwen's 151,936), the beams at the nodes of B random
items' first s tokens (s = 1 .. code_length; s = 0 is the prompt's step: R = ceil(B / 100)
requests at the root, D the root's degree):
- "walk": CatalogueConstraint.nodes over the N token columns (one searchsorted a column), eager
  and (on CUDA) compiled by Inductor;
- the mask (ops/trie_mask.py): "torch bias" (the reference), "triton bias", each then added to
  FP32 log-probs [B, V] as programs/beam.py does ("+ add"), and the in-place forms on those
  log-probs ("torch in place", "triton in place", and the latter at the launch configs of
  BLOCK_SWEEP, to choose its default); "torch allowed list + gather": the allowed tokens as a
  [B, D + S] list (trie_mask.allowed_tokens) and their log-probs gathered, what a selection over
  the allowed tokens alone would read instead of a [B, V] mask;
- the decode step's selection (the top K = 2W candidates of each beam, FP32 log-probs) with the
  constraint and without, at the same beams and logits (bf16 [B, V], as the LM head gives them):
  "plain, vocab_topk chunks" (the unconstrained program's selection, the peer), "mask + topk
  over V" (`trie_topk=separate`, the constrained default before 2026-12-03: FP32 log-softmax, the
  in-place torch mask, torch.topk over the row), and ops/trie_topk.py's gathered top K, eager and
  compiled by Inductor as a build compiles it ("compiled"), at D the catalogue's degree and at
  `--degree-bound` (a build's --catalogue-max-degree, 4096 by default: the program's D for trie
  inputs). The constraint's cost a step is a constrained row's time less the plain one's, plus
  the walk;
- a request's allow-list of `allow` item ids (ops/trie_reach.py): "reach from ids" (the device
  walk up from the allowed leaves), "reach from bitmap" (per level from ends), and the host's
  numpy `Catalogue.reachable` for scale.
Bytes (logical, for GB/s): a bias B x V x 4 written; + add: read log-probs and bias, write the
sum (3 x B x V x 4 more); in place: B x V x 4 written; the gathered list: B x (D + 1) x 16
(token ids and values); reach: the [nodes] bool rows written (ends, reach: 2 x nodes; from a
bitmap: reach's clone plus int32 sums, ~6 x nodes). The walk moves little (N binary searches a
beam): time only.

Timing: on CUDA, bench/kernel_timing.py's GPU time a call (a CUDA graph of back-to-back calls,
median of replays; plain CUDA events where a call cannot be captured); on the CPU the median
wall time of `repeats` calls (Triton rows only under TRITON_INTERPRET=1, else they are left out
with a note). GB/s against `--hbm-peak` (the H200's 4.8 TB/s) on CUDA.

    python -m boundgen.bench.catalogue [--items 1000000,10000000] [--beams 100,800]
    python -m boundgen.bench.catalogue --items 1000 --beams 4 --vocab 4096 --code-vocab 64  # CPU, tiny
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from boundgen.bench.kernel_timing import HBM_PEAK_BYTES_PER_S, gpu_time_us
from boundgen.ops import trie_mask, trie_reach, trie_topk, vocab_topk
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue

QWEN_VOCAB = 151936
W = 100  # beams a request (W2)
# The in-place kernel's launch configs (BLOCK, num_warps) timed beside its default (2048, 4).
BLOCK_SWEEP = [(1024, 4), (4096, 4), (4096, 8), (8192, 8)]


@dataclass(frozen=True)
class BuildCost:
    items: int
    nodes: int
    build_s: float
    build_peak_bytes: int  # Python + numpy allocations during from_sequences
    index_bytes: int  # the four arrays
    constraint_s: float  # CatalogueConstraint on the host
    to_device_s: float
    device_bytes: int  # the constraint's buffers

    def per_million(self, value: float) -> float:
        return value * 1e6 / self.items


@dataclass(frozen=True)
class StepTiming:
    items: int
    case: str
    rows: int
    impl: str
    ms: float
    bytes: float  # 0: not counted
    equal: bool | None  # its output equals the reference's; None: not checked (the reference itself)

    def gbps(self) -> float:
        return self.bytes / self.ms / 1e6 if self.bytes else float("nan")


def random_codes(items: int, code_length: int, code_vocab: int, seed: int = 0) -> np.ndarray:
    """[items, code_length] int64 distinct random codes (rows in random order)."""
    if code_vocab ** code_length < 2 * items:
        raise ValueError(f"{items} distinct codes of {code_length} tokens need a code vocabulary above "
                         f"{code_vocab} tokens")
    rng = np.random.default_rng(seed)
    codes = np.unique(rng.integers(0, code_vocab, size=(items, code_length)), axis=0)
    while len(codes) < items:  # duplicates drawn: draw more
        extra = rng.integers(0, code_vocab, size=(items - len(codes), code_length))
        codes = np.unique(np.concatenate((codes, extra)), axis=0)
    return codes[rng.permutation(len(codes))]


def title_codes(items: int, max_length: int, vocab: int, seed: int = 0, zipf: float = 1.2,
                short: float = 0.1) -> list[list[int]]:
    """`items` distinct token sequences shaped like titles cut to `max_length` tokens, for a
    catalogue over a real vocabulary (token ids below `vocab`): each position's token drawn from a
    Zipf(`zipf`) law over its own random order of the vocabulary (a few common first words, a long
    tail), so that some nodes have thousands of children where random codes have tens; a share
    `short` of the items shorter (1 .. max_length - 1 tokens: short titles, ended by a stop token)."""
    if max_length < 1 or vocab < 2:
        raise ValueError(f"titles need max_length >= 1 and a vocabulary of 2 tokens or more; got {max_length}, {vocab}")
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(vocab) for _ in range(max_length)]
    seen: set[tuple] = set()
    out: list[list[int]] = []
    tries = 0
    while len(out) < items:
        tries += 1
        if tries > 50:
            raise ValueError(f"could not draw {items} distinct titles of <= {max_length} tokens over {vocab} tokens")
        batch = 2 * (items - len(out)) + 64
        ranks = rng.zipf(zipf, size=(batch, max_length))
        ranks = np.where(ranks <= vocab, ranks, rng.integers(1, vocab + 1, size=ranks.shape)) - 1
        tokens = np.stack([orders[i][ranks[:, i]] for i in range(max_length)], axis=1)
        lengths = np.where(rng.random(batch) < short, rng.integers(1, max(max_length, 2), size=batch), max_length)
        for row, length in zip(tokens.tolist(), lengths.tolist()):
            title = tuple(row[:length])
            if title not in seen:
                seen.add(title)
                out.append(list(title))
                if len(out) == items:
                    break
    return out


def build(codes: np.ndarray, vocab: int, device: torch.device) -> tuple[Catalogue, CatalogueConstraint, BuildCost]:
    """The catalogue of `codes` (item i: codes[i]) and its constraint on `device`, with their costs."""
    lists = codes.tolist()  # the input as the items file gives it
    tracemalloc.start()
    start = time.perf_counter()
    cat = Catalogue.from_sequences(np.arange(len(lists)), lists)
    build_s = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del lists
    stop = codes.max() + 1  # a stop token past the code vocabulary: codes of N - 1 tokens end with it
    start = time.perf_counter()
    constraint = CatalogueConstraint(cat, vocab, codes.shape[1] + 1, (int(stop),))
    constraint_s = time.perf_counter() - start
    start = time.perf_counter()
    constraint = constraint.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    to_device_s = time.perf_counter() - start
    index_bytes = sum(a.nbytes for a in (cat.row_ptr, cat.child_token, cat.node_item, cat.level_ptr))
    device_bytes = sum(b.numel() * b.element_size() for b in constraint.buffers())
    return cat, constraint, BuildCost(len(codes), cat.num_nodes, build_s, peak, index_bytes, constraint_s,
                                      to_device_s, device_bytes)


def step_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Time of one call of `fn` in ms: GPU time on CUDA, else the median wall time of `repeats`."""
    if device.type == "cuda":
        try:
            return gpu_time_us(fn) / 1e3
        except RuntimeError:  # not capturable in a CUDA graph: CUDA events around a loop
            torch.cuda.synchronize()
            fn()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(20):
                fn()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 20
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def beam_nodes(codes: np.ndarray, constraint: CatalogueConstraint, beams: int, step: int, device: torch.device,
               seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq [B, N], nodes [B]): B random items' first `step` tokens, -1 after, and their nodes."""
    rng = np.random.default_rng(seed)
    seq = np.full((beams, codes.shape[1] + 1), -1, dtype=np.int64)
    seq[:, :step] = codes[rng.integers(0, len(codes), size=beams), :step]
    seq = torch.from_numpy(seq).to(device)
    return seq, constraint.nodes(constraint.own_trie(), seq)


def bench_steps(codes: np.ndarray, constraint: CatalogueConstraint, beams: int, vocab: int, device: torch.device,
                repeats: int, left_out: dict, seed: int = 0, degree_bound: int = 4096) -> list[StepTiming]:
    """One catalogue at B beams: the walk, the mask at every step, in each implementation (the
    Triton ones checked equal to the reference first; `left_out` collects those that cannot run)."""
    c, items, rows = constraint, len(codes), []
    own = c.own_trie()  # the program's trie arrays, one length M, as the mask ops take them
    trie = (own.row_ptr, own.child_token, own.reach, own.ends, c.stop_token_ids[:1])
    gen = torch.Generator(device=device).manual_seed(seed)
    for step in range(codes.shape[1] + 1):
        if step == 0:
            count, degree, case = math.ceil(beams / W), c.root_degree, f"mask, step 0 (root, D={c.root_degree})"
            seq, nodes = None, torch.zeros(count, dtype=torch.int64, device=device)
        else:
            count, degree, case = beams, max(c.max_degree, 1), f"mask, step {step} (D={max(c.max_degree, 1)})"
            seq, nodes = beam_nodes(codes, c, beams, step, device, seed + step)
        logp = torch.log_softmax(torch.randn(count, vocab, device=device, generator=gen), dim=-1)
        scores = logp.clone()
        row_bytes = count * vocab * 4
        want = trie_mask.reference(nodes, *trie, vocab, degree)
        impls = {
            "torch bias": (lambda: trie_mask.reference(nodes, *trie, vocab, degree), row_bytes, None),
            "triton bias": (lambda: trie_mask.launch(nodes, *trie, vocab, degree), row_bytes,
                            lambda: torch.equal(trie_mask.launch(nodes, *trie, vocab, degree), want)),
            "torch bias + add": (lambda: logp + trie_mask.reference(nodes, *trie, vocab, degree), 4 * row_bytes,
                                 None),
            "triton bias + add": (lambda: logp + trie_mask.launch(nodes, *trie, vocab, degree), 4 * row_bytes,
                                  None),
            "torch in place": (lambda: trie_mask.apply_reference(scores, nodes, *trie, degree), row_bytes, None),
            "triton in place": (lambda: trie_mask.apply_launch(scores, nodes, *trie, degree), row_bytes,
                                lambda: in_place_equal(logp, nodes, trie, degree)),
            "torch allowed list + gather": (lambda: gather_allowed(logp, nodes, trie, vocab, degree),
                                            count * (degree + 1) * 16.0, None),
        }
        for block, warps in BLOCK_SWEEP:
            config = dict(block=block, num_warps=warps)
            impls[f"triton in place, block {block} w{warps}"] = (
                lambda k=config: trie_mask.apply_launch(scores, nodes, *trie, degree, **k), row_bytes,
                lambda k=config: in_place_equal(logp, nodes, trie, degree, **k))
        rows += timed(items, case, count, impls, device, repeats, left_out)
        if step:
            rows += bench_selection(items, step, nodes, trie, vocab, degree, degree_bound, device, repeats,
                                    left_out, gen)
        if step == codes.shape[1] - 1:
            walks = {"torch": (lambda s=seq: c.nodes(own, s), 0.0, None)}
            if device.type == "cuda":  # as a build compiles it
                walk = torch.compile(c.nodes, dynamic=False)
                walks["compiled"] = (lambda s=seq: walk(own, s), 0.0, None)
            rows += timed(items, f"walk, {seq.shape[1]} columns", beams, walks, device, repeats, left_out)
    return rows


def bench_selection(items: int, step: int, nodes: torch.Tensor, trie: tuple, vocab: int, degree: int,
                    degree_bound: int, device: torch.device, repeats: int, left_out: dict,
                    gen: torch.Generator) -> list[StepTiming]:
    """A decode step's selection of K = 2W candidates a beam, plain and constrained (module docstring)."""
    beams, k = nodes.shape[0], 2 * W
    logits = torch.randn(beams, vocab, device=device, generator=gen).to(torch.bfloat16)
    stops = trie[-1]

    def separate():
        return trie_topk.separate(logits, nodes, *trie, None, k, degree)

    compiled = torch.compile(trie_topk.reference, dynamic=False) if device.type == "cuda" else None
    want = separate()
    impls = {"plain, vocab_topk chunks": (lambda: vocab_topk.chunked(logits, None, k), 0.0, None),
             "mask + topk over V": (separate, 0.0, None)}
    for bound in dict.fromkeys((degree, max(degree_bound, degree))):
        call = (lambda d=bound: trie_topk.reference(logits, nodes, *trie[:4], stops, None, k, d))
        impls[f"gathered top K, D={bound}"] = (call, 0.0, lambda c=call: same_selection(c(), want))
        if compiled is not None:  # Inductor's log-softmax rounds its own way: equal within FP32 ulps
            fast = (lambda d=bound: compiled(logits, nodes, *trie[:4], stops, None, k, d))
            impls[f"gathered top K compiled, D={bound}"] = (fast, 0.0,
                                                             lambda c=fast: same_selection(c(), want, atol=1e-5))
    return timed(items, f"selection, step {step} (K={k})", beams, impls, device, repeats, left_out)


def same_selection(got: tuple, want, atol: float = 0.0) -> bool:
    """The gathered top K equals the separate ops' on every slot of finite log-prob (ops/trie_topk.py):
    the same values in order (within `atol`: compiled code rounds the log-softmax its own way) and,
    per row, the same tokens (bf16 logits tie, and torch.topk orders equal values as it likes)."""
    finite = torch.isfinite(want.values)
    if not torch.equal(torch.isfinite(got[0]), finite):
        return False
    if not torch.allclose(got[0][finite], want.values[finite], rtol=0.0, atol=atol):
        return False
    none = torch.full_like(want.indices, -1)
    return torch.equal(torch.where(finite, got[1], none).sort(dim=1).values,
                       torch.where(finite, want.indices, none).sort(dim=1).values)


def gather_allowed(logp: torch.Tensor, nodes: torch.Tensor, trie: tuple, vocab: int, degree: int) -> torch.Tensor:
    """[B, D + S]: the log-probs of each beam's allowed tokens, -inf in the empty slots: what a
    selection over the allowed tokens alone reads, in place of a [B, V] mask."""
    cols = trie_mask.allowed_tokens(nodes, *trie, vocab, degree)
    return logp.gather(1, cols.clamp(max=vocab - 1)).masked_fill(cols == vocab, float("-inf"))


def in_place_equal(logp: torch.Tensor, nodes: torch.Tensor, trie: tuple, degree: int, **launch_config) -> bool:
    got, want = logp.clone(), logp.clone()
    trie_mask.apply_launch(got, nodes, *trie, degree, **launch_config)
    trie_mask.apply_reference(want, nodes, *trie, degree)
    return torch.equal(got, want)


def bench_allow_list(cat: Catalogue, constraint: CatalogueConstraint, allow: int, device: torch.device,
                     repeats: int, left_out: dict, seed: int = 0) -> list[StepTiming]:
    """A request's allow-list of `allow` random item ids: its ends / reach, four ways (the level
    walk from the ids, serving's path table, from a bitmap, numpy on the host)."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(cat.node_item[cat.node_item >= 0], size=min(allow, cat.num_items), replace=False)
    n = cat.num_nodes
    row_ptr = constraint.row_ptr  # the program's trie arrays, one length M, as trie_reach takes them
    keys, item_nodes = trie_reach.item_index(constraint.node_item)
    paths = trie_reach.item_paths(item_nodes, row_ptr, cat.depth)
    allow_items = torch.from_numpy(ids).to(device)
    ends = trie_reach.reach_from_allowed(allow_items, keys, item_nodes, row_ptr, cat.depth)[0]
    levels = cat.level_ptr.tolist()
    case = f"allow-list of {len(ids)} items"
    want_ends, want_reach = cat.reachable(ids)
    want_reach, want_ends = catalogue_search.padded(cat, (want_reach, want_ends))
    from_ids = (lambda: trie_reach.reach_from_allowed(allow_items, keys, item_nodes, row_ptr, cat.depth))
    from_paths = (lambda: trie_reach.reach_from_paths(allow_items, keys, paths, row_ptr.shape[0]))
    from_bitmap = (lambda: trie_reach.reach_from_ends(ends, row_ptr, levels))
    impls = {"reach from ids": (from_ids, 2.0 * n, lambda: same_rows(from_ids()[:2], (want_ends, want_reach))),
             "reach from ids, path table": (from_paths, 2.0 * n,
                                            lambda: same_rows(from_paths()[:2], (want_ends, want_reach))),
             "reach from bitmap": (from_bitmap, 6.0 * n, lambda: same_rows((from_bitmap(),), (want_reach,)))}
    rows = timed(cat.num_items, case, 1, impls, device, repeats, left_out)
    host = cpu_ms(lambda: cat.reachable(ids), repeats)
    return rows + [StepTiming(cat.num_items, case, 1, "numpy Catalogue.reachable (host)", host, 0.0, None)]


def same_rows(got: tuple, want: tuple) -> bool:
    return all(np.array_equal(g.cpu().numpy(), w) for g, w in zip(got, want))


def timed(items: int, case: str, count: int, impls: dict, device: torch.device, repeats: int,
          left_out: dict) -> list[StepTiming]:
    """impls: name -> (call, bytes, check: () -> equal to the reference, or None). A call that
    raises (a Triton kernel on a CPU without TRITON_INTERPRET=1) is left out and noted once."""
    rows = []
    for impl, (fn, nbytes, check) in impls.items():
        try:
            equal = None if check is None else bool(check())
            rows.append(StepTiming(items, case, count, impl, step_ms(fn, device, repeats), nbytes, equal))
        except Exception as exc:
            left_out.setdefault(impl, f"{type(exc).__name__}: {str(exc)[:160]}")
    return rows


def cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def build_table(costs: list[BuildCost]) -> str:
    lines = ["| items | nodes | build (s) | build s / M items | build peak MB / M items | index MB / M items "
             "| constraint on host (s) | to device (s) | device MB / M items |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in costs:
        lines.append(f"| {b.items:,} | {b.nodes:,} | {b.build_s:.2f} | {b.per_million(b.build_s):.2f} | "
                     f"{b.per_million(b.build_peak_bytes) / 1e6:.0f} | {b.per_million(b.index_bytes) / 1e6:.1f} | "
                     f"{b.constraint_s:.2f} | {b.to_device_s:.3f} | {b.per_million(b.device_bytes) / 1e6:.1f} |")
    return "\n".join(lines)


def step_table(rows: list[StepTiming], hbm_peak: float | None) -> str:
    peak = f" | % HBM peak ({hbm_peak / 1e12:.1f} TB/s)" if hbm_peak else ""
    lines = ["| items | case | rows | implementation | ms | MB moved | GB/s" + peak + " | equal to reference |",
             "|---:|---|---:|---|---:|---:|---:" + ("|---:" if hbm_peak else "") + "|---|"]
    for r in rows:
        gbps = "" if not r.bytes else f"{r.gbps():.0f}"
        share = "" if not hbm_peak else (" | " if not r.bytes else f" | {100 * r.gbps() * 1e9 / hbm_peak:.1f}")
        equal = "" if r.equal is None else ("yes" if r.equal else "NO")
        lines.append(f"| {r.items:,} | {r.case} | {r.rows} | {r.impl} | {r.ms:.4f} | "
                     f"{r.bytes / 1e6:.2f} | {gbps}{share} | {equal} |")
    return "\n".join(lines)


def positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be comma-separated positive integers; got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.catalogue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default="1000000,10000000", help="catalogue sizes, comma-separated")
    parser.add_argument("--beams", default="100,800", help="beams a step (R x W), comma-separated")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="the model's vocabulary V")
    parser.add_argument("--code-vocab", type=int, default=32768, help="tokens a code is drawn from")
    parser.add_argument("--code-length", type=int, default=4, help="tokens a code")
    parser.add_argument("--allow", type=int, default=10000, help="items in a request's allow-list")
    parser.add_argument("--degree-bound", type=int, default=4096,
                        help="a build's --catalogue-max-degree: the gathered top K's D beside the catalogue's own")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    parser.add_argument("--repeats", type=int, default=5, help="calls timed on the CPU (median)")
    parser.add_argument("--hbm-peak", type=float, default=HBM_PEAK_BYTES_PER_S, help="B/s, for the %% column on CUDA")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        items, beams = positive_ints(args.items, "--items"), positive_ints(args.beams, "--beams")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, and this machine has no CUDA device", file=sys.stderr)
        return 2
    if args.code_vocab >= args.vocab:
        print(f"error: --code-vocab {args.code_vocab} must be below --vocab {args.vocab} (a stop token follows "
              "the codes' tokens)", file=sys.stderr)
        return 2
    costs, rows, left_out = [], [], {}
    for count in items:
        codes = random_codes(count, args.code_length, args.code_vocab, args.seed)
        cat, constraint, cost = build(codes, args.vocab, device)
        costs.append(cost)
        for b in beams:
            rows += bench_steps(codes, constraint, b, args.vocab, device, args.repeats, left_out, args.seed,
                                args.degree_bound)
        rows += bench_allow_list(cat, constraint, args.allow, device, args.repeats, left_out, args.seed)
        del cat, constraint, codes
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"Catalogues of {args.code_length}-token codes over {args.code_vocab:,} tokens, V = {args.vocab:,}, "
          f"on {name}\n")
    print(build_table(costs) + "\n")
    print(step_table(rows, args.hbm_peak if device.type == "cuda" else None))
    for impl, why in left_out.items():
        print(f"\n{impl}: left out ({why})")
    return 1 if any(r.equal is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
