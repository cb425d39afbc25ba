"""Kernel-level A/B of a beam decode step's candidate selection (ops/vocab_topk.py) on CUDA: bf16
logits [rows, 151,936] made by an LM head (hidden [rows, 896] x an embedding with uneven token
norms, plus a Zipf-like token prior: torch.topk's cost depends on the values, ~2x slower on LM-head
outputs than on N(0, 1)), two barred tokens, rows 100 / 800 / 1,600 (1, 8, 16 requests of W = 100)
and K = 200 / 400: (a) "torch reference": FP32 log_softmax + torch.topk (the default lowering), (b)
"torch-lse": torch.topk on the bf16 logits + FP32 logsumexp, (c) "triton" (and its SELECTION_SWEEP
launch configs), (c') "chunks" (ops/chunk_max.py's kernel, then torch.topk over the chunks and over
the top K chunks' values; "chunks-triton": both top-Ks in one kernel, ops/chunk_select.py; its
CHUNKS_SWEEP of chunk_max launches and chunk widths, and the chunk_max kernel alone), (d) the
LM-head GEMM [rows, 896] x [896, 151,936] that makes the logits, for scale. Bytes: the logits once (2
rows V). Error: max |logp - reference logp| (both sorted best first, so equal values in another tie
order still compare equal); nan for the GEMM.
"""

from __future__ import annotations

import argparse
import sys

import torch

from boundgen.bench.kernel_timing import KernelTiming, gpu_time_us
from boundgen.ops import chunk_max, chunk_select, vocab_topk

QWEN_VOCAB = 151936
# vocab_topk launch configs (BLOCK, num_warps, pipeline stages) timed beside the default.
SELECTION_SWEEP = [(4096, 8, 3), (4096, 16, 1), (2048, 8, 3)]
# "chunks" variants (chunk width, chunk_max tile, segment, num_warps) timed beside its default.
CHUNKS_SWEEP = [(32, 4096, 16384, 8), (32, 2048, 8192, 4), (32, 2048, 32768, 4), (16, 2048, 16384, 4),
                (8, 2048, 16384, 4), (64, 2048, 16384, 4)]


def lm_head_logits(rows: int, vocab: int, hidden: int = 896, device: str = "cuda", seed: int = 0,
                   dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden [rows, H], weight [V, H], logits [rows, V]): an LM head's output, not N(0, 1)
    (uneven token norms, a Zipf-like prior, every 17th row peaked on one token)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(rows, hidden, device=device, generator=gen).to(dtype)
    norms = 0.5 + torch.rand(vocab, 1, device=device, generator=gen)
    weight = (torch.randn(vocab, hidden, device=device, generator=gen) * norms / hidden ** 0.5).to(dtype)
    rank = torch.randperm(vocab, device=device, generator=gen).float()
    logits = 3.0 * (h.float() @ weight.float().T) + (6.0 - 1.5 * torch.log1p(rank / 50))
    logits[::17, vocab // 3] += 25.0
    return h, weight, logits.to(dtype)


def bench_vocab_topk(rows: int, k: int, vocab: int = QWEN_VOCAB, hidden: int = 896, device: str = "cuda",
                     calls: int = 20, replays: int = 10, dtype: torch.dtype = torch.bfloat16,
                     sweep: bool = True) -> list[KernelTiming]:
    """Candidate selection of one decode step over `rows` beams: (a)-(d) of the module docstring."""
    h, weight, logits = lm_head_logits(rows, vocab, hidden, device, seed=rows + k, dtype=dtype)
    bias = torch.zeros(vocab, device=device)
    bias[[vocab - 2, vocab - 1]] = float("-inf")  # barred stop tokens (min_new_tokens)
    impls = {"torch reference": lambda: vocab_topk.reference(logits, bias, k),
             "torch-lse": lambda: vocab_topk.reference_lse(logits, bias, k),
             "triton": lambda: vocab_topk.launch(logits, bias, k)}
    if sweep:
        for block, warps, stages in SELECTION_SWEEP:
            impls[f"triton block {block} w{warps} s{stages}"] = (
                lambda b=block, w=warps, st=stages: vocab_topk.launch(logits, bias, k, block=b, num_warps=w, stages=st))
    impls["chunks"] = lambda: vocab_topk.chunked(logits, bias, k)
    impls["chunks-triton"] = lambda: vocab_topk.chunked_select(logits, bias, k)
    if sweep:
        select_chunk = vocab_topk.select_chunk_size(vocab, k)
        for warps in (8, 32):
            impls[f"chunks-triton w{warps}"] = (lambda w=warps: chunk_select.launch(
                logits, bias, *chunk_max.launch(logits, bias, select_chunk), k, select_chunk, num_warps=w))
        for chunk, tile, segment, warps in CHUNKS_SWEEP:
            chunk = vocab_topk.chunk_size(vocab, k, chunk)  # one that divides V

            def maxima(c=chunk, t=tile, sg=segment, w=warps):
                return chunk_max.launch(logits, bias, c, tile=t, segment=sg, num_warps=w)
            impls[f"chunks {chunk} tile {tile} seg {segment} w{warps}"] = (
                lambda c=chunk, maxima=maxima: vocab_topk.select_from_chunks(logits, bias, k, *maxima(), c))
    case = f"selection rows={rows} V={vocab} K={k}"
    work = (0.0, float(logits.numel() * logits.element_size()))
    expected = impls["torch reference"]()[0]
    out = []
    for impl, fn in impls.items():
        err = (fn()[0] - expected).abs().nan_to_num(0.0).max().item()  # -inf - -inf (barred) is nan
        out.append(KernelTiming(case, impl, gpu_time_us(fn, calls, replays), *work, err))
    chunk = vocab_topk.chunk_size(vocab, k)
    out.append(KernelTiming(case, "chunk_max kernel alone", gpu_time_us(lambda: chunk_max.launch(logits, bias, chunk),
                                                                         calls, replays), *work, float("nan")))
    gemm = (2.0 * rows * hidden * vocab, float((rows * hidden + vocab * hidden + rows * vocab) * h.element_size()))
    out.append(KernelTiming(case, "lm-head GEMM (scale)", gpu_time_us(lambda: h @ weight.T, calls, replays),
                            *gemm, float("nan")))
    return out


def run_selection_benchmarks(device: str = "cuda", rows: tuple[int, ...] = (100, 800, 1600),
                             ks: tuple[int, ...] = (200, 400), calls: int = 20, replays: int = 10,
                             sweep: bool = True) -> list[KernelTiming]:
    """Candidate selection at every (rows, K) (`python -m boundgen.bench.selection`)."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel benchmarks need a CUDA device")
    return [t for k in ks for r in rows
            for t in bench_vocab_topk(r, k, device=device, calls=calls, replays=replays, sweep=sweep)]


def selection_table(rows: list[KernelTiming]) -> str:
    """Selection cases as time, speedup over the torch reference (a) and multiple of the GEMM (d)."""
    lines = ["| case | implementation | time (us) | speedup vs (a) | x LM-head GEMM | max abs logp err |",
             "|---|---|---:|---:|---:|---:|"]
    for case in dict.fromkeys(r.case for r in rows):
        of_case = [r for r in rows if r.case == case]
        ref = next(r.time_us for r in of_case if r.impl == "torch reference")
        gemm = next(r.time_us for r in of_case if r.impl.startswith("lm-head GEMM"))
        for r in of_case:
            lines.append(f"| {case} | {r.impl} | {r.time_us:.1f} | {ref / r.time_us:.2f} | "
                         f"{r.time_us / gemm:.2f} | {r.max_abs_err:.2e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Candidate selection at rows 100 / 800 / 1,600 and K 200 / 400, the launch sweeps at K 200 only
    (they compile), as a markdown table; the table is rewritten after each case, so a run cut short keeps it."""
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.selection", description=main.__doc__)
    parser.add_argument("--markdown", metavar="FILE", default="selection.md", help="table file (default %(default)s)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: kernel benchmarks need a CUDA device", file=sys.stderr)
        return 2
    rows: list[KernelTiming] = []
    for k in (200, 400):
        for r in (100, 800, 1600):
            rows += bench_vocab_topk(r, k, sweep=k == 200)
            with open(args.markdown, "w") as f:
                f.write(selection_table(rows) + "\n")
    print(selection_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
