"""Kernel-level A/B on CUDA of the attention ops (Triton kernel vs torch reference vs SDPA) and the
elementwise ops (Triton kernels vs torch references).

Cases (ARCHITECTURE.md workloads, bf16):
- W1 packed prefill: 15 sequences of lengths uniform in [48, 256] (seeded), Qwen3-0.6B heads
  16 q / 8 kv, D 128. SDPA runs on the sequences right-padded to L_max ([B, N, L_max, D],
  is_causal, enable_gqa): what a lowering without a varlen kernel does (padding not timed).
- W2/W3 beam decode: W = 100, Qwen2.5-0.5B heads 14 q / 2 kv, D 64, L_p 64 and 400, L_s 1..4.
  SDPA reads K/V concatenated per beam ([W, N_kv, L_p + L_s, D]): "sdpa" with the
  concatenation prebuilt, "sdpa+cat" building it in the timed call (its real cost).
  The Triton kernel runs in its default layout and with one beam per program.
  Batched beam requests: R = 4, 8 prompts of 64 tokens packed, W = 100 each, L_s 4, at
  Qwen2.5 (BW 2 divides W) and Qwen3-0.6B heads (16/8, D 128: BW 8, blocks span requests).
The packed kernel also runs with the launch configs of PACKED_SWEEP, to pick the default.
`--packed-sweep stacked` times the `triton_stacked` kernel (ops/packed_attention_stacked.py) at the
launch configs of PACKED_STACKED_GRID beside `triton`, `triton_gqa` and PyTorch's FlashAttention-2,
at W1's shapes of one and four requests a call (`bench_packed_stacked`).
`--packed-qk` times a Qwen3 prefill layer's q/k norm + RoPE + attention at the same shapes
(`bench_packed_qk`): qk_norm_rope then `triton_gqa`, at their defaults, against the fused kernel
(ops/packed_attention_qk.py), each with its own bytes; `--packed-qk --sweep` adds PACKED_QK_SWEEP's
launch configs of the fused kernel:
    python -m boundgen.bench.kernels --packed-qk [--sweep] [--markdown FILE]

Elementwise ops (bf16, Triton kernel vs the torch reference, which is several kernels each):
RMSNorm over hidden states and per head (q/k views of a fused qkv row, as the model passes
them), RoPE on q/k, silu_mul on gate_up; W1 at Qwen3-0.6B shapes (T 2400, H 1024, heads 16/8
of D 128, I 3072), W2 at Qwen2.5-0.5B shapes (T 100 beams, H 896, heads 14/2 of D 64, I 4864);
Qwen3's q/k norm + RoPE as the torch references (eager and Inductor-compiled), the separate Triton
ops and the fused kernel (`bench_qk_norm_rope`); a beam decode step's RoPE + K/V write, the
reference compiled against the fused kernel (`bench_rope_kv_write`).
Their FLOPs are elementwise operation counts (rough); bytes are what matters.

The memory-bound kernels of a W1 layer (`--memory-bound`, `bench_memory_bound`): rmsnorm,
add_rmsnorm, add_rmsnorm_quant, qk_norm_rope and silu_quant at 2,250 / 4,500 / 9,000 tokens, bytes
counted exactly, optionally beside 28a37ab's kernels (`--variant new,old`), their launch configs
(`--sweep`) and with inputs read from HBM (`--cold`). The command line prints a roofline table
(kernel_timing.roofline_table: GB/s and % of `--hbm-peak`, FLOPs and % of the tensor peak for
attention), also written to `--markdown FILE`.

Candidate selection: bench/selection.py. Timing (bench/kernel_timing.py): GPU time per call, a
CUDA graph of `calls` back-to-back calls replayed `replays` times (median), so host launch
overhead is out and L2 is warm (as in the model, where the preceding projection has just written
q/k/v). Throughput uses *logical* work, the same for every
implementation: FLOPs 4 D N_q x (causal (query, key) pairs), bytes = q + k + v + out read or
written once (the prefix once, not once per beam). Ceilings: kernel_timing's H200 peaks (`--hbm-peak` overrides).
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import torch.nn.functional as F
import triton

from boundgen.bench import previous_kernels
from boundgen.bench.kernel_timing import (HBM_PEAK_BYTES_PER_S, PEAK_BF16_FLOPS, KernelTiming, markdown_table,
                                          measure, roofline_table)
from boundgen.bench.selection import run_selection_benchmarks
from boundgen.ops import (add_rmsnorm, add_rmsnorm_quant, decode_attention, packed_attention, prefix_attention,
                          qk_norm_rope, rmsnorm, rope, rope_kv_write, silu_mul, silu_quant)

# Packed-kernel launch configs (BLOCK_M, BLOCK_N, num_warps, num_stages) timed beside the default.
PACKED_SWEEP = [(64, 64, 4, 2), (64, 32, 4, 2), (64, 64, 8, 2), (128, 64, 8, 3)]
# A wider grid for choosing the default at head dim 128 (W1): `python -m boundgen.bench.kernels --packed-sweep`.
PACKED_GRID = [(m, n, w, s) for m, n in ((32, 32), (64, 16), (64, 32), (64, 64), (128, 32), (128, 64))
               for w in (4, 8) for s in (2, 3)]
# The same with the query heads of a K/V head in one program (the `triton_gqa` lowering; BLOCK_M counts
# tokens, the tile has BLOCK_M x pack rows). The fifth field is `pack`.
PACKED_GQA_SWEEP = [(16, 32, 4, 2, 2), (32, 64, 4, 2, 2), (64, 32, 8, 2, 2)]
PACKED_GQA_GRID = [(m, n, w, s, 2) for m, n in ((16, 32), (16, 64), (32, 32), (32, 64), (64, 32), (64, 64))
                   for w in (4, 8) for s in (2, 3)]
# The `triton_stacked` kernel's configs (BLOCK_M tokens, BLOCK_N, warps, stages, pack) for
# `--packed-sweep stacked`: 128-row tiles (64 tokens x 2 heads, a warpgroup a head, or 128 tokens of one
# head) at BLOCK_N 16-128 and 2-4 stages; 4 warps on 128 rows (one warpgroup: spills on sm_90), 256 rows,
# and 64-row tiles as controls; three with K/V off the diagonal through TMA tensor descriptors (a sixth
# field, True). 22 configs (the default among them is timed once), each compiled once for both call sizes.
PACKED_STACKED_GRID = ([(64, n, 8, s, 2) for n in (16, 32, 64) for s in (2, 3, 4) if (n, s) != (16, 2)]
                       + [(64, 64, 4, 2, 2), (64, 32, 4, 3, 2), (128, 64, 8, 2, 2), (32, 32, 4, 2, 2), (32, 32, 4, 3, 2)]
                       + [(128, n, 8, s, 1) for n, s in ((64, 2), (64, 3), (32, 3), (128, 2))]
                       + [(64, 64, 4, 2, 1), (64, 32, 4, 3, 1)]
                       + [(64, 32, 8, 2, 2, True), (64, 64, 8, 3, 2, True), (128, 64, 8, 2, 1, True)])


def packed_work(lengths: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
                elem_bytes: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of packed causal attention over sequences of `lengths`."""
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    tokens = sum(lengths)
    return (4.0 * head_dim * num_q_heads * pairs,
            float(tokens * (2 * num_q_heads + 2 * num_kv_heads) * head_dim * elem_bytes))


def prefix_work(width: int, prefix_len: int, suffix_len: int, num_q_heads: int,
                num_kv_heads: int, head_dim: int, elem_bytes: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of one beam step over a shared prefix and per-beam suffixes."""
    flops = 4.0 * head_dim * num_q_heads * width * (prefix_len + suffix_len)
    elems = 2 * width * num_q_heads + 2 * (prefix_len + width * suffix_len) * num_kv_heads
    return flops, float(elems * head_dim * elem_bytes)


def w1_lengths(seed: int = 0, count: int = 15, low: int = 48, high: int = 256) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (count,), generator=gen).tolist()


def bench_packed(lengths: list[int], heads=(16, 8), head_dim: int = 128, device: str = "cuda",
                 calls: int = 20, replays: int = 10, dtype: torch.dtype = torch.bfloat16,
                 configs=PACKED_SWEEP + PACKED_GQA_SWEEP, stacked_configs=()) -> list[KernelTiming]:
    """The packed kernels (`triton`, `triton_gqa`, `triton_stacked` at their default configs, then
    the first at each of `configs`: (BLOCK_M, BLOCK_N, warps, stages[, pack]), the stacked one at each
    of `stacked_configs`: (BLOCK_M, BLOCK_N, warps, stages, pack)) against the reference and SDPA."""
    num_q_heads, num_kv_heads = heads
    tokens = sum(lengths)
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                              device=device)
    qkv = torch.randn(tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, device=device,
                      dtype=dtype)
    q, k, v = (t.reshape(tokens, -1, head_dim) for t in
               qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim,
                          num_kv_heads * head_dim], dim=-1))
    q = q.contiguous()  # as after RoPE; v stays a strided view of qkv, as in the model
    k = k.contiguous()
    scale = head_dim ** -0.5
    padded = [torch.zeros(len(lengths), t.shape[1], max(lengths), head_dim, device=device,
                          dtype=dtype) for t in (q, k, v)]  # [B, N, L_max, D]
    starts = cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(starts[:-1], starts[1:])):
        for dst, src in zip(padded, (q, k, v)):
            dst[i, :, : end - start] = src[start:end].transpose(0, 1)

    def sdpa() -> torch.Tensor:
        out = F.scaled_dot_product_attention(*padded, is_causal=True, scale=scale, enable_gqa=True)
        return torch.cat([out[i, :, : end - start].transpose(0, 1)
                          for i, (start, end) in enumerate(zip(starts[:-1], starts[1:]))])

    impls = {
        "triton": lambda: packed_attention.launch(q, k, v, cu_seqlens, scale),
        "triton_gqa": lambda: packed_attention.triton_gqa_attention(q, k, v, cu_seqlens, scale),
        "triton_stacked": lambda: packed_attention.launch_stacked(q, k, v, cu_seqlens, scale),
        "torch reference": lambda: packed_attention.reference(q, k, v, cu_seqlens, scale),
        "sdpa (padded)": sdpa,
    }
    if q.is_cuda and dtype in packed_attention.FLASH_DTYPES:  # elsewhere the flash lowering is the reference
        impls["flash (PyTorch's FlashAttention-2)"] = (
            lambda: packed_attention.flash(q, k, v, cu_seqlens, scale, max(lengths)))
    group = num_q_heads // num_kv_heads
    for config in configs:
        pack = config[4] if len(config) > 4 else 1
        if group % pack or config[:4] == packed_attention.default_config(head_dim, pack):
            continue
        name = "triton m{} n{} w{} s{}".format(*config) + (f" pack{pack}" if pack > 1 else "")
        impls[name] = lambda c=config[:4], p=pack: packed_attention.launch(q, k, v, cu_seqlens, scale, *c, pack=p)
    if q.is_cuda and any(len(c) > 5 and c[5] for c in stacked_configs):
        # Tensor descriptors made in the kernel take global scratch from Triton's allocator (none by default)
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    for config in stacked_configs:
        tiles, tma = config[:5], len(config) > 5 and config[5]
        if group % tiles[4] or (not tma and tiles == (*packed_attention.stacked_config(head_dim, tiles[4]), tiles[4])):
            continue
        name = "stacked m{} n{} w{} s{} pack{}".format(*tiles) + (" tma" if tma else "")
        impls[name] = lambda c=tiles, t=tma: packed_attention.launch_stacked(q, k, v, cu_seqlens, scale, *c, tma=t)
    case = (f"packed B={len(lengths)} T={tokens} L={min(lengths)}-{max(lengths)} "
            f"heads {num_q_heads}/{num_kv_heads} D={head_dim}")
    return measure(case, impls, packed_work(lengths, num_q_heads, num_kv_heads, head_dim,
                                             dtype.itemsize), calls, replays, tensor_peak=PEAK_BF16_FLOPS)


def bench_packed_stacked(requests=(1, 4), seed: int = 0, configs=PACKED_STACKED_GRID,
                         **kwargs) -> list[KernelTiming]:
    """W1's packed attention at calls of each of `requests` requests (15 sequences of 48-256 tokens a
    request): the `triton_stacked` kernel at each of `configs` beside the existing lowerings' defaults
    (`triton`, `triton_gqa`) and PyTorch's FlashAttention-2. `kwargs` go to bench_packed."""
    rows = []
    for n in requests:
        rows += bench_packed(w1_lengths(seed, count=15 * n), configs=(), stacked_configs=configs, **kwargs)
    return rows


# packed_attention_qk launch configs (BLOCK_M tokens, BLOCK_N, num_warps, num_stages) timed with `--packed-qk --sweep`.
PACKED_QK_SWEEP = [(32, 32, 4, 2), (32, 16, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (64, 64, 8, 3), (128, 32, 8, 2)]


def bench_packed_qk(lengths: list[int], heads=(16, 8), head_dim: int = 128, device: str = "cuda", calls: int = 20,
                    replays: int = 10, dtype: torch.dtype = torch.bfloat16, configs=(),
                    eps: float = 1e-6) -> list[KernelTiming]:
    """A Qwen3 prefill layer's q/k norm + RoPE + packed attention from the fused qkv output: (a)
    qk_norm_rope then packed attention's `triton_gqa` kernel, at their default configs, (b) the fused
    kernel (ops/packed_attention_qk.py) at its default and at each of `configs` (BLOCK_M tokens,
    BLOCK_N, warps, stages). Two cases, each with its own bytes: (a) also writes and reads back the
    rotated q and k. Errors against the torch reference composition (untimed)."""
    from boundgen.ops import packed_attention_qk

    num_q, num_kv = heads
    gen = torch.Generator(device=device).manual_seed(sum(lengths))
    tokens = sum(lengths)
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    qkv = (torch.randn(tokens, (num_q + 2 * num_kv) * head_dim, device=device, generator=gen) * 3).to(dtype)
    wq, wk = (1 + 0.1 * torch.randn(2, head_dim, device=device, generator=gen)).to(dtype)
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 1e6).to(device), dtype)
    scale = head_dim ** -0.5
    v = qk_norm_rope.split_heads(qkv, num_q, num_kv, head_dim)[2]
    pack = packed_attention.gqa_pack(num_q, num_kv)
    norm_args = (qkv, wq, wk, cos, sin, eps, num_q, num_kv)
    fused_args = (qkv, wq, wk, cos, sin, eps, cu_seqlens, scale, num_q, num_kv)

    def separate():
        q, k = qk_norm_rope.launch(*norm_args)
        return packed_attention.launch(q, k, v, cu_seqlens, scale, pack=pack)

    fused = {"fused triton": lambda: packed_attention_qk.launch(*fused_args)}
    for config in configs:
        if tuple(config) != packed_attention_qk.default_config(head_dim, pack):
            fused["fused m{} n{} w{} s{}".format(*config)] = (
                lambda c=config: packed_attention_qk.launch(*fused_args, None, *c))
    expected = packed_attention_qk.reference(*fused_args)
    flops = packed_work(lengths, num_q, num_kv, head_dim, dtype.itemsize)[0]
    e = dtype.itemsize
    rotated = tokens * (num_q + num_kv) * head_dim * e  # q and k heads, once
    side = (2 * tokens * head_dim + 2 * head_dim) * e  # cos / sin, both weights
    fused_bytes = rotated + tokens * (num_kv + num_q) * head_dim * e + side  # q, k in; v in, out
    separate_bytes = fused_bytes + 2 * rotated  # the rotated q and k written, then read back
    case = (f"qk norm+rope+attention B={len(lengths)} T={tokens} L={min(lengths)}-{max(lengths)} "
            f"heads {num_q}/{num_kv} D={head_dim}")
    return (measure(f"{case}, separate", {"qk_norm_rope + triton_gqa": separate}, (flops, float(separate_bytes)),
                    calls, replays, reference=lambda: expected, tensor_peak=PEAK_BF16_FLOPS)
            + measure(f"{case}, fused", fused, (flops, float(fused_bytes)), calls, replays,
                      reference=lambda: expected, tensor_peak=PEAK_BF16_FLOPS))


def bench_prefix(width: int, prefix_len: int, suffix_len: int, heads=(14, 2), head_dim: int = 64,
                 device: str = "cuda", calls: int = 20, replays: int = 10,
                 dtype: torch.dtype = torch.bfloat16, requests: int = 1) -> list[KernelTiming]:
    """One beam step of `requests` packed requests (R), W beams each over its own L_p prompt."""
    num_q_heads, num_kv_heads = heads
    scale = head_dim ** -0.5
    beams = requests * width

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    q = randn(beams, num_q_heads, head_dim)
    tokens = requests * prefix_len
    k_prefix, v_prefix = randn(tokens, num_kv_heads, head_dim), randn(tokens, num_kv_heads, head_dim)
    cu_seqlens = torch.arange(0, tokens + 1, prefix_len, device=device, dtype=torch.int32)
    slots = suffix_len + 1  # a suffix buffer with room for the next step: slices are strided
    k_suffix = randn(beams, slots, num_kv_heads, head_dim)[:, :suffix_len]
    v_suffix = randn(beams, slots, num_kv_heads, head_dim)[:, :suffix_len]
    step = torch.tensor([suffix_len - 1], device=device)  # all L_s positions valid
    args = (q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width, scale)
    impls = {
        "triton": lambda: prefix_attention.launch(*args),
        "triton 1 beam/program": lambda: prefix_attention.launch(*args, beams_per_program=1),
        "torch reference": lambda: prefix_attention.reference(*args),
    }
    if requests == 1:  # SDPA over K/V concatenated per beam: one prompt only
        def concatenated(prefix, suffix):  # [W, N_kv, L_p + L_s, D]
            return torch.cat((prefix.expand(width, *prefix.shape), suffix), dim=1).transpose(1, 2)

        k_full, v_full = concatenated(k_prefix, k_suffix), concatenated(v_prefix, v_suffix)

        def sdpa(k_all, v_all) -> torch.Tensor:
            out = F.scaled_dot_product_attention(q[:, :, None], k_all, v_all, scale=scale,
                                                 enable_gqa=True)
            return out[:, :, 0]

        impls["sdpa"] = lambda: sdpa(k_full, v_full)
        impls["sdpa+cat"] = lambda: sdpa(concatenated(k_prefix, k_suffix),
                                         concatenated(v_prefix, v_suffix))
    case = (f"prefix R={requests} W={width} L_p={prefix_len} L_s={suffix_len} heads "
            f"{num_q_heads}/{num_kv_heads} D={head_dim}")
    flops, nbytes = prefix_work(width, prefix_len, suffix_len, num_q_heads, num_kv_heads, head_dim,
                                dtype.itemsize)
    return measure(case, impls, (requests * flops, requests * nbytes), calls, replays, tensor_peak=PEAK_BF16_FLOPS)


def _qkv_view(num_tokens: int, num_heads: int, head_dim: int, device: str, dtype: torch.dtype):
    """[T, N, D] view of a wider row (as q/k are views of the fused qkv output): not contiguous."""
    qkv = torch.randn(num_tokens, 2 * num_heads * head_dim, device=device, dtype=dtype)
    return qkv[:, : num_heads * head_dim].reshape(num_tokens, num_heads, head_dim)


def bench_rmsnorm(num_tokens: int, hidden: int, num_heads: int | None = None, device: str = "cuda",
                  calls: int = 20, replays: int = 10,
                  dtype: torch.dtype = torch.bfloat16) -> list[KernelTiming]:
    """RMSNorm over x [T, hidden], or with num_heads over a [T, num_heads, hidden] qkv view."""
    if num_heads is None:
        x = torch.randn(num_tokens, hidden, device=device, dtype=dtype)
        case = f"rmsnorm T={num_tokens} H={hidden}"
    else:
        x = _qkv_view(num_tokens, num_heads, hidden, device, dtype)
        case = f"rmsnorm per head T={num_tokens} N={num_heads} D={hidden}"
    weight = 1 + 0.1 * torch.randn(hidden, device=device, dtype=dtype)
    impls = {"triton": lambda: rmsnorm.launch(x, weight, 1e-6),
             "torch reference": lambda: rmsnorm.reference(x, weight, 1e-6)}
    work = (4.0 * x.numel(), float((2 * x.numel() + hidden) * dtype.itemsize))
    return measure(case, impls, work, calls, replays)


def bench_rope(num_tokens: int, num_heads: int, head_dim: int, strided: bool, device: str = "cuda",
               calls: int = 20, replays: int = 10,
               dtype: torch.dtype = torch.bfloat16) -> list[KernelTiming]:
    """RoPE on x [T, N, D]: a qkv view (strided) or contiguous (as after the Qwen3 q/k norm)."""
    x = _qkv_view(num_tokens, num_heads, head_dim, device, dtype)
    x = x if strided else x.contiguous()
    positions = torch.arange(num_tokens, device=device)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 1e6).to(device), dtype)
    impls = {"triton": lambda: rope.launch(x, cos, sin),
             "torch reference": lambda: rope.reference(x, cos, sin)}
    work = (3.0 * x.numel(), float((2 * x.numel() + 2 * cos.numel()) * dtype.itemsize))
    case = f"rope T={num_tokens} N={num_heads} D={head_dim}{' qkv view' if strided else ''}"
    return measure(case, impls, work, calls, replays)


# qk_norm_rope launch configs (BLOCK_T, num_warps) timed beside the default.
QK_NORM_ROPE_SWEEP = [(1, 4), (2, 8), (4, 4), (4, 8)]


def bench_qk_norm_rope(num_tokens: int, heads=(16, 8), head_dim: int = 128, device: str = "cuda",
                       calls: int = 20, replays: int = 10, dtype: torch.dtype = torch.bfloat16,
                       sweep: bool = True) -> list[KernelTiming]:
    """Qwen3's q/k norm + RoPE on a fused qkv output: the torch references (eager; and compiled by
    Inductor, what an artifact with the torch lowerings runs), the separate Triton rmsnorm and rope
    ops (four launches), the fused kernel (ops/qk_norm_rope.py) and its QK_NORM_ROPE_SWEEP."""
    num_q, num_kv = heads
    gen = torch.Generator(device=device).manual_seed(num_tokens)
    qkv = (torch.randn(num_tokens, (num_q + 2 * num_kv) * head_dim, device=device, generator=gen) * 3).to(dtype)
    wq, wk = (1 + 0.1 * torch.randn(2, head_dim, device=device, generator=gen)).to(dtype)
    cos, sin = rope.cos_sin(torch.arange(num_tokens, device=device), rope.inv_freq(head_dim, 1e6).to(device), dtype)
    args = (qkv, wq, wk, cos, sin, 1e-6, num_q, num_kv)
    q, k, _ = qk_norm_rope.split_heads(qkv, num_q, num_kv, head_dim)

    def separate():
        return (rope.launch(rmsnorm.launch(q, wq, 1e-6), cos, sin), rope.launch(rmsnorm.launch(k, wk, 1e-6), cos, sin))
    compiled = torch.compile(qk_norm_rope.reference, dynamic=False)
    impls = {"torch reference": lambda: qk_norm_rope.reference(*args),
             "inductor (reference compiled)": lambda: compiled(*args),
             "triton rmsnorm + rope (4 launches)": separate,
             "fused triton": lambda: qk_norm_rope.launch(*args)}
    if sweep:
        for block_t, warps in QK_NORM_ROPE_SWEEP:
            impls[f"fused block_t {block_t} w{warps}"] = (
                lambda b=block_t, w=warps: qk_norm_rope.launch(*args, block_t=b, num_warps=w))
    elements = num_tokens * (num_q + num_kv) * head_dim
    work = (8.0 * elements, float((2 * elements + 2 * cos.numel() + 2 * head_dim) * dtype.itemsize))
    return measure(f"qk_norm_rope T={num_tokens} heads={num_q}/{num_kv} D={head_dim}", impls, work, calls, replays)


def bench_rope_kv_write(rows: int, heads=(14, 2), head_dim: int = 64, slots: int = 4, layers: int = 24,
                        device: str = "cuda", calls: int = 20, replays: int = 10,
                        dtype: torch.dtype = torch.bfloat16, block_ts: tuple[int, ...] = ()) -> list[KernelTiming]:
    """A beam decode step's RoPE of q and k and K/V write into slot 2 of layer 1 (W2: Qwen2.5-0.5B
    heads, `rows` = R x W beams): the torch reference (eager; and compiled by Inductor, what a
    build with the separate ops runs) against the fused kernel (ops/rope_kv_write.py), at its
    default launch config and at each of `block_ts` rows a program."""
    num_q, num_kv = heads
    gen = torch.Generator(device=device).manual_seed(rows)
    qkv = torch.randn(rows, (num_q + 2 * num_kv) * head_dim, device=device, generator=gen).to(dtype)
    cos, sin = rope.cos_sin(torch.arange(rows, device=device) % 400, rope.inv_freq(head_dim, 1e6).to(device), dtype)
    step = torch.tensor([2], device=device)
    compiled = torch.compile(rope_kv_write.reference, dynamic=False)

    def run(fn):
        k, v = (torch.zeros(layers, rows, slots, num_kv, head_dim, device=device, dtype=dtype) for _ in range(2))
        return lambda: (fn(qkv, cos, sin, k, v, step, 1, num_q, num_kv), k[1, :, 2], v[1, :, 2])
    impls = {"torch reference": run(rope_kv_write.reference),
             "inductor (reference compiled)": run(compiled),
             "fused triton": run(rope_kv_write.launch)}
    for block_t in block_ts:
        impls[f"fused triton, BLOCK_T={block_t}"] = run(functools.partial(rope_kv_write.launch, block_t=block_t))
    elements = rows * (num_q + 2 * num_kv) * head_dim
    work = (6.0 * rows * (num_q + num_kv) * head_dim, float((2 * elements + 2 * cos.numel()) * dtype.itemsize))
    return measure(f"rope_kv_write B={rows} heads={num_q}/{num_kv} D={head_dim}", impls, work, calls, replays)


def bench_decode_attention(requests: int, prefix_len: int, width: int = 100, heads=(14, 2), head_dim: int = 64,
                           slots: int = 4, layers: int = 24, device: str = "cuda", calls: int = 24, replays: int = 10,
                           dtype: torch.dtype = torch.bfloat16) -> list[KernelTiming]:
    """A beam decode layer's attention at step 2 (three suffix slots valid) of `requests` packed
    requests of `width` beams over prompts of `prefix_len` tokens (Qwen2.5-0.5B heads): what a
    decode layer launches without the fused op (rope_kv_write, then prefix_attention: 2 launches)
    against the fused kernel (ops/decode_attention.py, 1 launch), `calls` of each in one CUDA graph
    (24: a decode step's layers)."""
    num_q, num_kv = heads
    beams = requests * width
    gen = torch.Generator(device=device).manual_seed(beams)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)
    qkv = randn(beams, (num_q + 2 * num_kv) * head_dim)
    cos, sin = rope.cos_sin(prefix_len + torch.zeros(beams, dtype=torch.int64, device=device) + 2,
                            rope.inv_freq(head_dim, 1e6).to(device), dtype)
    k_prefix, v_prefix = randn(requests * prefix_len, num_kv, head_dim), randn(requests * prefix_len, num_kv, head_dim)
    cu_seqlens = torch.arange(0, requests * prefix_len + 1, prefix_len, device=device, dtype=torch.int32)
    step, scale = torch.tensor([2], device=device), head_dim ** -0.5
    suffix_k, suffix_v = randn(layers, beams, slots, num_kv, head_dim), randn(layers, beams, slots, num_kv, head_dim)

    def run(fn):
        return lambda: (fn(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, 1, width, scale,
                           num_q, num_kv), suffix_k[1, :, 2], suffix_v[1, :, 2])
    impls = {"torch reference": run(decode_attention.reference),
             "rope_kv_write + prefix_attention (2 launches)": run(decode_attention.launch_pair),
             "fused triton (1 launch)": run(decode_attention.launch)}
    flops, nbytes = prefix_work(width, prefix_len, 3, num_q, num_kv, head_dim, dtype.itemsize)
    qkv_bytes = beams * (num_q + 2 * num_kv) * head_dim * dtype.itemsize  # read once; q is no longer written and read
    return measure(f"decode attention R={requests} W={width} L_p={prefix_len} heads={num_q}/{num_kv} D={head_dim}",
                   impls, (requests * flops, requests * nbytes + qkv_bytes), calls, replays,
                   tensor_peak=PEAK_BF16_FLOPS)


def bench_silu_mul(num_tokens: int, inter: int, device: str = "cuda", calls: int = 20,
                   replays: int = 10, dtype: torch.dtype = torch.bfloat16) -> list[KernelTiming]:
    x = torch.randn(num_tokens, 2 * inter, device=device, dtype=dtype)
    impls = {"triton": lambda: silu_mul.launch(x),
             "torch reference": lambda: silu_mul.reference(x)}
    work = (5.0 * num_tokens * inter, float(3 * num_tokens * inter * dtype.itemsize))
    return measure(f"silu_mul T={num_tokens} I={inter}", impls, work, calls, replays)


def bench_silu_quant(num_tokens: int, inter: int = 3072, device: str = "cuda", calls: int = 20, replays: int = 10,
                     dtype: torch.dtype = torch.bfloat16, configs=((1, 4), (1, 8), (2, 4), (2, 8))) -> list[KernelTiming]:
    """An FP8 MLP's SwiGLU + E4M3 rowwise quantization (W1: Qwen3-0.6B, I 3,072): Inductor's compile
    of the reference against the Triton kernel with IEEE divisions and with the fast ones, at each
    (BLOCK_T, num_warps) of `configs`. The error column compares dequantized values (not timed:
    until 2026-12-01 the dequantization was inside the timed call)."""
    x = torch.randn(num_tokens, 2 * inter, device=device, dtype=dtype)
    compiled = torch.compile(silu_quant.reference, dynamic=False)
    impls = {"torch reference": lambda: silu_quant.reference(x), "inductor (reference compiled)": lambda: compiled(x),
             "triton, IEEE divisions": lambda: silu_quant.launch(x, ieee_div=True)}
    for block_t, warps in configs:
        impls[f"triton, fast divisions, BLOCK_T={block_t} w{warps}"] = functools.partial(
            silu_quant.launch, x, block_t, warps, False)
    work = (5.0 * num_tokens * inter, float(num_tokens * (inter * (2 * dtype.itemsize + 1) + 4)))
    return measure(f"silu_quant T={num_tokens} I={inter}", impls, work, calls, replays,
                    compared=lambda out: out[0].float() * out[1])  # dequantized values


def bench_elementwise(device: str = "cuda", calls: int = 20, replays: int = 10,
                      dtype: torch.dtype = torch.bfloat16) -> list[KernelTiming]:
    """RMSNorm, RoPE and silu_mul at W1 (Qwen3-0.6B, T 2400) and W2 (Qwen2.5-0.5B, T 100) shapes."""
    kw = dict(device=device, calls=calls, replays=replays, dtype=dtype)
    return (bench_rmsnorm(2400, 1024, **kw) + bench_rmsnorm(2400, 128, num_heads=16, **kw)
            + bench_rope(2400, 16, 128, strided=False, **kw)
            + bench_rope(2400, 8, 128, strided=False, **kw) + bench_silu_mul(2400, 3072, **kw)
            + bench_rmsnorm(100, 896, **kw) + bench_rope(100, 14, 64, strided=True, **kw)
            + bench_rope(100, 2, 64, strided=True, **kw) + bench_silu_mul(100, 4864, **kw))


# The memory-bound kernels of a W1 layer (`--memory-bound`): W1 rows (one, two, four requests a
# call), the launch configs (BLOCK rows or tokens, num_warps) timed with `sweep`, the kernels of
# 28a37ab (bench/previous_kernels.py) with the "old" variant.
W1_ROWS = (2250, 4500, 9000)
MEMORY_BOUND_SWEEP = {"rmsnorm": ((1, 2), (1, 4), (2, 2), (4, 4), (4, 8)),
                      "qk_norm_rope": QK_NORM_ROPE_SWEEP, "silu_quant": ((1, 8), (2, 4), (2, 8))}
VARIANTS = ("new", "old")
COLD_BYTES = 128 << 20  # > 2.5 x the H200's L2: inputs rotated over this many bytes are read from HBM


def _rotating(make, nbytes: int, cold: bool) -> list:
    """Input sets for a benchmark: one, or (cold) enough copies of `nbytes` each that a call's
    inputs have left L2 when their turn comes again (as in the model, where they are cold)."""
    return [make() for _ in range(max(2, -(-COLD_BYTES // nbytes)) if cold else 1)]


def _turns(fn, sets):
    """fn over the input sets in turn, the first call on set 0 (the one the error is checked on)."""
    turn = itertools.count()
    return lambda: fn(*sets[next(turn) % len(sets)])


def bench_memory_bound(num_tokens: int, variants=("new",), sweep: bool = False, cold: bool = False,
                       device: str = "cuda", calls: int = 20, replays: int = 10, dtype: torch.dtype = torch.bfloat16,
                       hidden: int = 1024, heads=(16, 8), head_dim: int = 128, inter: int = 3072,
                       eps: float = 1e-6) -> list[KernelTiming]:
    """rmsnorm, add_rmsnorm, add_rmsnorm_quant (x [T, H]), qk_norm_rope (qkv [T, (Nq + 2 Nkv) D])
    and silu_quant (x [T, 2I]) at W1 shapes (Qwen3-0.6B), each variant ("new": the ops' kernels;
    "old": 28a37ab's) against the op's torch reference (untimed; E4M3 outputs compared
    dequantized). Bytes: exactly what a call reads and writes (weights, cos / sin and scales
    included); FLOPs are not counted (none of these is GEMM-like). `cold`: inputs rotated over
    COLD_BYTES, so that they come from HBM."""
    if any(v not in VARIANTS for v in variants):
        raise ValueError(f"variants are {VARIANTS}; got {variants}")
    gen = torch.Generator(device=device).manual_seed(num_tokens)
    e, t = dtype.itemsize, num_tokens

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

    where = " cold" if cold else ""
    rows = []
    weight = (1 + 0.1 * torch.randn(hidden, device=device, generator=gen)).to(dtype)
    sets = _rotating(lambda: (randn(t, hidden, scale=3.0), randn(t, hidden)), 2 * t * hidden * e, cold)
    n_calls = max(calls, len(sets))
    x0, d0 = sets[0]
    norms = {"rmsnorm": (False, False, lambda: rmsnorm.reference(x0, weight, eps), (2 * t * hidden + hidden) * e),
             "add_rmsnorm": (True, False, lambda: add_rmsnorm.reference(x0, d0, weight, eps),
                             (4 * t * hidden + hidden) * e),
             "add_rmsnorm_quant": (True, True, lambda: add_rmsnorm_quant.reference(x0, d0, weight, eps),
                                   (3 * t * hidden + hidden) * e + t * hidden + 4 * t)}
    for name, (add, quant, reference, nbytes) in norms.items():
        def new(x, d, block=None, warps=None, add=add, quant=quant):
            return rmsnorm.launch(x, weight, eps, block, warps, delta=d if add else None, quantize=quant)

        def old(x, d, add=add, quant=quant):
            return previous_kernels.rmsnorm_launch(x, weight, eps, d if add else None, quant)
        impls = {}
        if "new" in variants:
            impls["triton"] = _turns(new, sets)
            for block, warps in MEMORY_BOUND_SWEEP["rmsnorm"] if sweep else ():
                impls[f"triton rows {block} w{warps}"] = _turns(functools.partial(new, block=block, warps=warps), sets)
        if "old" in variants:
            impls["triton, 28a37ab kernel"] = _turns(old, sets)
        compared = (lambda out: (out[0], out[1].float() * out[2])) if quant else None
        rows += measure(f"{name} T={t} H={hidden}{where}", impls, (0.0, float(nbytes)), n_calls, replays,
                        compared=compared, reference=reference)

    num_q, num_kv = heads
    wq, wk = (1 + 0.1 * torch.randn(2, head_dim, device=device, generator=gen)).to(dtype)

    def qkv_set():
        cos, sin = rope.cos_sin(torch.randint(0, 4096, (t,), device=device, generator=gen),
                                rope.inv_freq(head_dim, 1e6).to(device), dtype)
        return randn(t, (num_q + 2 * num_kv) * head_dim, scale=3.0), cos, sin
    sets = _rotating(qkv_set, t * (num_q + 2 * num_kv + 2) * head_dim * e, cold)
    n_calls = max(calls, len(sets))
    qkv0, cos0, sin0 = sets[0]
    impls = {}
    if "new" in variants:
        impls["triton"] = _turns(lambda qkv, cos, sin: qk_norm_rope.launch(qkv, wq, wk, cos, sin, eps, num_q, num_kv),
                                 sets)
        for block, warps in MEMORY_BOUND_SWEEP["qk_norm_rope"] if sweep else ():
            impls[f"triton tokens {block} w{warps}"] = _turns(
                lambda qkv, cos, sin, b=block, w=warps: qk_norm_rope.launch(qkv, wq, wk, cos, sin, eps, num_q, num_kv,
                                                                            block_t=b, num_warps=w), sets)
    if "old" in variants:
        impls["triton, 28a37ab kernel"] = _turns(
            lambda qkv, cos, sin: previous_kernels.qk_norm_rope_launch(qkv, wq, wk, cos, sin, eps, num_q, num_kv), sets)
    elements = t * (num_q + num_kv) * head_dim
    nbytes = (2 * elements + 2 * t * head_dim + 2 * head_dim) * e  # q, k heads in and out, cos / sin, weights
    rows += measure(f"qk_norm_rope T={t} heads={num_q}/{num_kv} D={head_dim}{where}", impls, (0.0, float(nbytes)),
                    n_calls, replays, reference=lambda: qk_norm_rope.reference(qkv0, wq, wk, cos0, sin0, eps, num_q,
                                                                                num_kv))

    sets = _rotating(lambda: (randn(t, 2 * inter),), 2 * t * inter * e, cold)
    n_calls = max(calls, len(sets))
    impls = {}
    if "new" in variants:
        impls["triton"] = _turns(silu_quant.launch, sets)
        for block, warps in MEMORY_BOUND_SWEEP["silu_quant"] if sweep else ():
            impls[f"triton rows {block} w{warps}"] = _turns(
                functools.partial(silu_quant.launch, block_t=block, num_warps=warps), sets)
    if "old" in variants:
        impls["triton, 28a37ab kernel"] = _turns(previous_kernels.silu_quant_launch, sets)
    nbytes = t * (inter * (2 * e + 1) + 4)  # gate and up in, E4M3 out, a scale a row
    x0 = sets[0][0]
    rows += measure(f"silu_quant T={t} I={inter}{where}", impls, (0.0, float(nbytes)), n_calls, replays,
                    compared=lambda out: out[0].float() * out[1], reference=lambda: silu_quant.reference(x0))
    return rows


def run_kernel_benchmarks(device: str = "cuda", seed: int = 0, calls: int = 20,
                          replays: int = 10) -> list[KernelTiming]:
    """All cases: W1 packed prefill, W2/W3 beam steps (L_p 64 and 400, L_s 1..4), the
    elementwise ops at W1 and W2 shapes, then candidate selection at K = 200 (no sweep)."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel benchmarks need a CUDA device")
    rows = bench_packed(w1_lengths(seed), device=device, calls=calls, replays=replays)
    for prefix_len in (64, 400):
        for suffix_len in range(1, 5):
            rows += bench_prefix(100, prefix_len, suffix_len, device=device, calls=calls,
                                 replays=replays)
    for requests in (4, 8):  # batched beam requests: R prompts of 64 tokens in one call
        rows += bench_prefix(100, 64, 4, device=device, calls=calls, replays=replays,
                             requests=requests)
        rows += bench_prefix(100, 64, 4, heads=(16, 8), head_dim=128, device=device,
                             calls=calls, replays=replays, requests=requests)
    rows += bench_elementwise(device, calls, replays)
    return rows + run_selection_benchmarks(device, ks=(200,), calls=calls, replays=replays, sweep=False)


def _token_list(text: str | None, flag: str, parser) -> list[int]:
    try:
        tokens = [int(t) for t in text.split(",")] if text else []
    except ValueError:
        tokens = [0]
    if any(t <= 0 for t in tokens):
        parser.error(f"{flag} takes a comma list of positive token counts, got {text!r}")
    return tokens


def main(argv: list[str] | None = None) -> int:
    """Kernel A/Bs one at a time (the full set is `run_kernel_benchmarks`, run by `boundgen bench`,
    or `--all`), printed as a roofline table: time, bytes moved, GB/s and % of the HBM peak, and
    for GEMM-like kernels FLOPs and % of the tensor peak."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.kernels", description=main.__doc__)
    parser.add_argument("--packed-sweep", nargs="?", const="tiles", choices=("tiles", "stacked"), default=None,
                        help="packed attention at W1 shapes: every PACKED_GRID and PACKED_GQA_GRID launch config of "
                             "the triton kernel (tiles, the default), or the triton_stacked kernel's "
                             "PACKED_STACKED_GRID at calls of 1 and 4 requests (stacked), printed with TFLOP/s and "
                             "%% of the BF16 peak")
    parser.add_argument("--packed-qk", action="store_true",
                        help="Qwen3's q/k norm + RoPE + packed attention at W1 shapes (calls of 1 and 4 requests): "
                             "qk_norm_rope then triton_gqa against the fused packed_attention_qk kernel; with "
                             "--sweep also PACKED_QK_SWEEP's launch configs of the fused kernel")
    parser.add_argument("--decode-attention", metavar="REQUESTS", default=None,
                        help="a beam decode layer's RoPE, K/V write and prefix attention, separate and fused, at "
                             "these requests a call (comma list, e.g. 1,8): W2 prompts, and W3's at the first two")
    parser.add_argument("--silu-quant", metavar="TOKENS", default=None,
                        help="SwiGLU + E4M3 quantization at these token counts (comma list, e.g. 2250,4500,9000)")
    parser.add_argument("--memory-bound", metavar="TOKENS", nargs="?", const=",".join(map(str, W1_ROWS)),
                        default=None, help="rmsnorm, add_rmsnorm, add_rmsnorm_quant, qk_norm_rope and silu_quant at "
                                           "W1 shapes at these token counts (default 2250,4500,9000)")
    parser.add_argument("--variant", default="new",
                        help="--memory-bound kernels: new (the ops'), old (28a37ab's), or both: new,old")
    parser.add_argument("--sweep", action="store_true", help="--memory-bound: time MEMORY_BOUND_SWEEP's launch "
                                                             "configs beside the defaults (--packed-qk: "
                                                             "PACKED_QK_SWEEP's)")
    parser.add_argument("--cold", action="store_true",
                        help="--memory-bound: inputs rotated over 128 MB, read from HBM (default: warm in L2)")
    parser.add_argument("--all", action="store_true", help="every case of run_kernel_benchmarks (attention, "
                                                          "elementwise, selection)")
    parser.add_argument("--hbm-peak", type=float, default=HBM_PEAK_BYTES_PER_S,
                        help="HBM bandwidth the table's %% is of, in B/s (default 4.8e12, the H200's)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(argv)
    if not (args.packed_sweep or args.packed_qk or args.silu_quant or args.memory_bound or args.decode_attention
            or args.all):
        parser.error("name at least one benchmark: --packed-sweep, --packed-qk, --silu-quant TOKENS, "
                     "--memory-bound [TOKENS], --decode-attention REQUESTS, --all")
    tokens = _token_list(args.silu_quant, "--silu-quant", parser)
    memory_tokens = _token_list(args.memory_bound, "--memory-bound", parser)
    decode_requests = _token_list(args.decode_attention, "--decode-attention", parser)
    variants = tuple(args.variant.split(","))
    if any(v not in VARIANTS for v in variants):
        parser.error(f"--variant takes a comma list of {', '.join(VARIANTS)}, got {args.variant!r}")
    if not torch.cuda.is_available():
        print("error: kernel benchmarks need a CUDA device", file=sys.stderr)
        return 2
    rows = run_kernel_benchmarks() if args.all else []
    rows += bench_packed(w1_lengths(), configs=PACKED_GRID + PACKED_GQA_GRID) if args.packed_sweep == "tiles" else []
    stacked = bench_packed_stacked() if args.packed_sweep == "stacked" else []
    for requests in (1, 4) if args.packed_qk else ():
        rows += bench_packed_qk(w1_lengths(count=15 * requests), configs=PACKED_QK_SWEEP if args.sweep else ())
    for t in tokens:
        rows += bench_silu_quant(t)
    for i, r in enumerate(decode_requests):
        for prefix_len in (64, 400) if i < 2 else (64,):
            rows += bench_decode_attention(r, prefix_len)
    for t in memory_tokens:
        rows += bench_memory_bound(t, variants, sweep=args.sweep, cold=args.cold)
    table = "\n\n".join(filter(None, [roofline_table(rows, args.hbm_peak) if rows else "",
                                      markdown_table(stacked) if stacked else ""]))
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
