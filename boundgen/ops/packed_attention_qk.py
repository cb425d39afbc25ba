"""Packed prefill attention with Qwen3's q/k norm and RoPE applied as q and k are loaded.

    qkv [T, (Nq + 2 Nkv) D] (the fused projection's output), q_weight [D], k_weight [D],
    cos / sin [T, D], eps, cu_seqlens [B+1] int32, scale, num_q_heads, num_kv_heads
    -> out [T, Nq, D] in qkv's dtype
    out = packed_attention(*qk_norm_rope(qkv, ...), v, cu_seqlens, scale), v the qkv view of
    qk_norm_rope.split_heads (`reference` below is exactly that composition)

Why: a W1 prefill layer (Qwen3-0.6B, 15 sequences of 48-256 tokens, T ~2,250) ran qk_norm_rope
(8.7 us on the H200) and then packed attention, which is memory-bound at these shapes (~65 FLOP a
byte, docs/benchmarks.md): the first writes the rotated q and k (T (Nq + Nkv) D) and the second
reads them back. Here the attention reads q and k straight from qkv and normalises and rotates them
in registers: no rotated q or k is ever stored, and a layer runs one kernel fewer.

Triton kernel: packed_attention's `triton_gqa` form (ops/packed_attention.py's docstring):
sequence-aligned query blocks, one program per (query block, K/V head) with the PACK query heads
of that K/V head interleaved as rows (row r: token r // PACK, head r % PACK), keys in BLOCK_N tiles
from the sequence start, the causal mask only on tiles that reach past the block's first row,
online softmax in FP32 with exp2, p cast to the input dtype for p @ v, FP32 inputs with IEEE dots.
What differs:
- q and k rows are loaded as their two halves [.., D/2] and go through qk_norm_rope's own helper
  (`norm_rope_halves`: the RMSNorm and rotate-half RoPE with its rounding sequence), so the values
  attended with are that kernel's; the scores are q1 @ k1^T + q2 @ k2^T (one accumulation).
- Each key tile is normalised and rotated in every program that reads it (the query blocks after
  it in its sequence): ~20 FP32 operations an element on the CUDA cores beside 4 x BLOCK_M x PACK
  FLOPs an element of the dots on the tensor cores, and the tile passes through registers (no
  asynchronous copy into shared memory for the dot) and a layout conversion.
- v is read from qkv as packed_attention reads it, the whole row.
Measured (H100, `bench.kernels --packed-qk --sweep`, bf16, W1's B 15 T 2,591 / B 60 T 9,515): slower
than what it replaces. qk_norm_rope + `triton_gqa` 34.9 / 106.1 us; this kernel 53.1-58.2 / 161.3-179.0
at 128-row tiles and 8 warps, 65-67 / 193-216 at `triton_gqa`'s 64-row tiles: it moves half the bytes
(33.2 against 65.0 MB a W1 call) but the key tiles' norm and RoPE, paid again by every query block
after them (about twice the key rows qk_norm_rope handles at 64-token blocks), cost more than the
bytes saved. Hence the lowering stays off.
Bytes moved: q and k heads read from qkv, v read, out written (T (2 Nq + 2 Nkv) D), cos / sin
(2 T D), both weights (from L2); qk_norm_rope + packed_attention also write and read back the
rotated q and k (2 T (Nq + Nkv) D more): at W1 in bf16 12 KB against 24 KB a token.
Block sizes (default_config): at D 128, 128-row tiles (BLOCK_M 64 tokens x 2 heads), BLOCK_N 32,
8 warps, 3 stages; `bench.kernels --packed-qk --sweep` times PACKED_QK_SWEEP. D >= 32: tl.dot needs
halves of at least 16.
SOFT_BF16 (the interpreter, whose bf16 tl.dot is wrong, triton-lang/triton#11584, and whose bf16
casts truncate): the dots' operands are cast to FP32, the roundings done on the bits.

Lowerings: "separate" (the default: no fused op, the model applies qk_norm_rope and packed_attention
as they are lowered) and "triton" (this kernel; the registered op runs `reference` on CPU). The model
calls it only in a prefill that keeps no K/V (the rotated k is never materialised) of a model with a
q/k norm (model/qwen.py).
"""

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import packed_attention, qk_norm_rope
from boundgen.ops.qk_norm_rope import norm_rope_halves  # by name: Inductor copies a kernel's helpers by name


def reference(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, eps: float, cu_seqlens: torch.Tensor, scale: float, num_q_heads: int,
              num_kv_heads: int, max_seqlen: int | None = None) -> torch.Tensor:
    """`max_seqlen` (every lowering takes it, as packed_attention's do) is not used here."""
    q, k = qk_norm_rope.reference(qkv, q_weight, k_weight, cos, sin, eps, num_q_heads, num_kv_heads)
    v = qk_norm_rope.split_heads(qkv, num_q_heads, num_kv_heads, q_weight.shape[0])[2]
    return packed_attention.reference(q, k, v, cu_seqlens, scale)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr):
    """acc + a @ b in FP32; IEEE for FP32 operands (else TF32 on the GPU), SOFT_BF16 in FP32."""
    if SOFT_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _normed_rotated(qkv_ptr, w_ptr, cos_ptr, sin_ptr, tokens, heads, row_ok, eps, stride_qkv, stride_cos,
                    stride_sin, HALF: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Rows (tokens, heads: column heads of qkv) [R] normalised with w and rotated, as
    qk_norm_rope's kernel writes them -> halves (y1, y2) [R, D/2] in qkv's dtype (zeros off row_ok)."""
    dtype = qkv_ptr.dtype.element_ty
    offs = tl.arange(0, HALF)[None, :]
    mask = row_ok[:, None]
    x_at = qkv_ptr + tokens[:, None] * stride_qkv + heads[:, None] * (2 * HALF) + offs
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [R, D/2]
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)
    cos_at = cos_ptr + tokens[:, None] * stride_cos + offs
    sin_at = sin_ptr + tokens[:, None] * stride_sin + offs
    cos1 = tl.load(cos_at, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_at + HALF, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_at, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_at + HALF, mask=mask, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + offs).to(tl.float32)  # [1, D/2]
    w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)
    return norm_rope_halves(x1, x2, w1, w2, cos1, cos2, sin1, sin2, eps, dtype, SOFT_BF16)


@triton.jit
def _attend_key_tiles(acc, l_i, m_i, q1, q2, qkv_ptr, wk_ptr, cos_ptr, sin_ptr, v_ptr, k_head, offs_m, eps,
                      stride_qkv, stride_cos, stride_sin, lo, hi, qk_scale, HALF: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, IEEE: tl.constexpr,
                      SOFT_BF16: tl.constexpr):
    """Online-softmax update of (acc [R, D], l_i [R], m_i [R]) over keys [lo, hi); k normalised
    and rotated as it is loaded (column head k_head of qkv), v read from v_ptr (this K/V head's)."""
    offs_d = tl.arange(0, 2 * HALF)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_range = offs_n < hi
        k1, k2 = _normed_rotated(qkv_ptr, wk_ptr, cos_ptr, sin_ptr, offs_n, offs_n * 0 + k_head, in_range, eps,
                                 stride_qkv, stride_cos, stride_sin, HALF, SOFT_BF16)  # [N, D/2] each
        s = _dot(q2, tl.trans(k2), _dot(q1, tl.trans(k1), None, IEEE, SOFT_BF16), IEEE, SOFT_BF16)
        s = (s * qk_scale).to(tl.float32)  # [R, N], log2 domain; an fp64 scale in AOTI builds
        if CAUSAL_MASK:
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offs_n[:, None] * stride_qkv + offs_d[None, :], mask=in_range[:, None],
                    other=0.0)  # [N, D]
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE, SOFT_BF16)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _packed_attention_qk_kernel(
        qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, out_ptr, cu_seqlens_ptr, eps, qk_scale, num_seqs,
        stride_qkv, stride_cos, stride_sin, stride_ot, stride_oh,
        NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, PACK: tl.constexpr, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr,
        SEQ_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    first_head = tl.program_id(1) * PACK  # PACK query heads of one K/V head a program
    kv_head = first_head // (NUM_Q // NUM_KV)

    # Which (sequence, query block) is this program? As ops/packed_attention.py finds it: sequence
    # s owns blocks [sum_{r<s} n_r, sum_{r<=s} n_r), n_r = cdiv(L_r, BLOCK_M), its last block first.
    # Written here, not in a shared helper: torch's analysis of what a kernel writes takes every
    # argument of a call whose result reaches a store's address as written, and a build would clone
    # cu_seqlens on every call (ops/packed_attention_stacked.py, bench/mutations.py).
    seq_start = pid * 0
    seq_end = pid * 0
    block = pid * 0
    blocks_before = pid * 0
    for chunk in range(0, num_seqs, SEQ_CHUNK):
        idx = chunk + tl.arange(0, SEQ_CHUNK)
        valid = idx < num_seqs
        starts = tl.load(cu_seqlens_ptr + idx, mask=valid, other=0)
        ends = tl.load(cu_seqlens_ptr + idx + 1, mask=valid, other=0)
        num_blocks = tl.cdiv(ends - starts, BLOCK_M)  # 0 where not valid
        blocks_through = blocks_before + tl.cumsum(num_blocks, axis=0)
        mine = (pid >= blocks_through - num_blocks) & (pid < blocks_through)
        seq_start += tl.sum(tl.where(mine, starts, 0))
        seq_end += tl.sum(tl.where(mine, ends, 0))
        block += tl.sum(tl.where(mine, blocks_through - 1 - pid, 0))
        blocks_before += tl.sum(num_blocks)
    # A spare program keeps seq_start = seq_end = 0: empty key loops, fully masked store.

    block_start = seq_start + block * BLOCK_M
    rows = tl.arange(0, BLOCK_M * PACK)
    offs_m = block_start + rows // PACK  # [R] token of each row
    heads = first_head + rows % PACK  # [R] query head of each row
    row_ok = offs_m < seq_end
    q1, q2 = _normed_rotated(qkv_ptr, wq_ptr, cos_ptr, sin_ptr, offs_m, heads, row_ok, eps, stride_qkv,
                             stride_cos, stride_sin, HALF, SOFT_BF16)  # [R, D/2] each
    v_ptr = qkv_ptr + (NUM_Q + NUM_KV + kv_head) * (2 * HALF)

    acc = tl.zeros([BLOCK_M * PACK, 2 * HALF], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * PACK], dtype=tl.float32)
    m_i = tl.full([BLOCK_M * PACK], -1.0e30, dtype=tl.float32)  # finite: no NaN in masked rows
    # Key tiles wholly at or before the block's first row need no causal mask.
    unmasked_end = seq_start + ((block_start + 1 - seq_start) // BLOCK_N) * BLOCK_N
    keys_end = tl.minimum(block_start + BLOCK_M, seq_end)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q1, q2, qkv_ptr, wk_ptr, cos_ptr, sin_ptr, v_ptr,
                                      NUM_Q + kv_head, offs_m, eps, stride_qkv, stride_cos, stride_sin,
                                      seq_start, unmasked_end, qk_scale, HALF, BLOCK_N, False, IEEE, SOFT_BF16)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q1, q2, qkv_ptr, wk_ptr, cos_ptr, sin_ptr, v_ptr,
                                      NUM_Q + kv_head, offs_m, eps, stride_qkv, stride_cos, stride_sin,
                                      unmasked_end, keys_end, qk_scale, HALF, BLOCK_N, True, IEEE, SOFT_BF16)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    offs_d = tl.arange(0, 2 * HALF)
    tl.store(out_ptr + offs_m[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher

def _check(qkv, q_weight, k_weight, cos, sin, cu_seqlens, num_q_heads, num_kv_heads) -> None:
    if num_q_heads < 1 or num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"packed_attention_qk: N_q={num_q_heads} must be a positive multiple of "
                         f"N_kv={num_kv_heads}")
    # D >= 32: the dots' halves >= 16
    qk_norm_rope.check_inputs(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, "packed_attention_qk", 32)
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or not cu_seqlens.is_contiguous():
        raise ValueError("packed_attention_qk: cu_seqlens must be a contiguous 1-D int32 tensor [B+1]; got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != qkv.device:
        raise ValueError(f"packed_attention_qk: all inputs must be on one device; got qkv on {qkv.device}, "
                         f"cu_seqlens on {cu_seqlens.device}")


def default_config(head_dim: int, pack: int) -> tuple[int, int, int, int]:
    """(BLOCK_M tokens, BLOCK_N, num_warps, num_stages). Fixed, not autotuned: deterministic builds.
    D >= 128: 128-row tiles (BLOCK_M x pack), BLOCK_N 32, 8 warps, 3 stages, among the fastest of
    PACKED_QK_SWEEP on the H100 at W1's shapes (bench.kernels --packed-qk --sweep: each key tile's
    norm and RoPE is paid once a program, so more rows a program pay less of it); packed_attention's
    64-row `triton_gqa` tiles at 4 warps spill at D 128 here, as BLOCK_N 64 does (sm_90 ptxas).
    Smaller D: packed_attention's default."""
    if head_dim >= 128:
        return max(128 // pack, 16), 32, 8, 3
    return packed_attention.default_config(head_dim, pack)


def launch(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor, eps: float, cu_seqlens: torch.Tensor, scale: float, num_q_heads: int,
           num_kv_heads: int, max_seqlen: int | None = None, block_m: int | None = None,
           block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
           pack: int | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference` (`max_seqlen` unused: the
    grid needs no bound). The launch config is overridable for tests and benchmarks; `pack` query
    heads of one K/V head share a program (default packed_attention.gqa_pack)."""
    _check(qkv, q_weight, k_weight, cos, sin, cu_seqlens, num_q_heads, num_kv_heads)
    num_tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    group = num_q_heads // num_kv_heads
    pack = packed_attention.gqa_pack(num_q_heads, num_kv_heads) if pack is None else pack
    if pack < 1 or pack & (pack - 1) or group % pack:
        raise ValueError(f"packed_attention_qk: pack must be a power of two dividing the group of {group} query "
                         f"heads a K/V head; got {pack}")
    default_m, default_n, default_warps, default_stages = default_config(head_dim, pack)
    block_m, block_n = block_m or default_m, block_n or default_n
    num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
    num_seqs = cu_seqlens.shape[0] - 1
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    grid = (triton.cdiv(num_tokens, block_m) + num_seqs, num_q_heads // pack)
    wrap_triton(_packed_attention_qk_kernel)[grid](
        qkv, q_weight, k_weight, cos, sin, out, cu_seqlens, eps, scale * math.log2(math.e), num_seqs,
        qkv.stride(0), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, BLOCK_M=block_m, BLOCK_N=block_n,
        PACK=pack, IEEE=qkv.dtype == torch.float32, SOFT_BF16=qkv.device.type == "cpu", SEQ_CHUNK=64,
        num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::packed_attention_qk", mutates_args=())
def packed_attention_qk(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, eps: float, cu_seqlens: torch.Tensor, scale: float, num_q_heads: int,
                        num_kv_heads: int) -> torch.Tensor:
    return launch(qkv, q_weight, k_weight, cos, sin, eps, cu_seqlens, scale, num_q_heads, num_kv_heads)


@packed_attention_qk.register_kernel("cpu")
def _(qkv, q_weight, k_weight, cos, sin, eps, cu_seqlens, scale, num_q_heads, num_kv_heads):
    return reference(qkv, q_weight, k_weight, cos, sin, eps, cu_seqlens, scale, num_q_heads, num_kv_heads)


@packed_attention_qk.register_fake
def _(qkv, q_weight, k_weight, cos, sin, eps, cu_seqlens, scale, num_q_heads, num_kv_heads):
    return qkv.new_empty((qkv.shape[0], num_q_heads, q_weight.shape[0]))


def triton_attention_qk(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, eps: float, cu_seqlens: torch.Tensor, scale: float, num_q_heads: int,
                        num_kv_heads: int, max_seqlen: int | None = None) -> torch.Tensor:
    """The registered op (the grid needs no bound on a sequence's length)."""
    return packed_attention_qk(qkv, q_weight, k_weight, cos, sin, eps, cu_seqlens, scale, num_q_heads, num_kv_heads)


# Lowerings by name ("separate": no fused op, the model composes qk_norm_rope and packed_attention as lowered).
IMPLEMENTATIONS = {"separate": None, "triton": triton_attention_qk}
