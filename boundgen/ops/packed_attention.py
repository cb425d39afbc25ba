"""Packed prefill attention: block-diagonal causal GQA attention over `cu_seqlens`.

Sequences are packed back to back, no padding: token i of the packed batch belongs to sequence
s with cu_seqlens[s] <= i < cu_seqlens[s+1], and attends to tokens j of the same sequence with
j <= i. Query head h reads K/V head h // (N_q / N_kv) (GQA, K/V never expanded).

    out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, h_kv]) v[j, h_kv]

Shapes: q [T, N_q, D], k/v [T, N_kv, D], cu_seqlens [B+1] int32 (cu_seqlens[0] = 0,
cu_seqlens[B] = T) -> out [T, N_q, D] in q's dtype. Softmax in FP32.
Bytes moved by a fused kernel: read q, k, v once per query block, write out; FLOPs
4 * D * N_q * sum_s L_s (L_s + 1) / 2.

`reference` defines the semantics and is the torch lowering (and the op's CPU kernel); the
Triton kernel never materialises scores. Eager, it attends one sequence at a time, so its scores
take N_q * max_s L_s^2 floats at once and its work grows with sum_s L_s^2, not T^2 (the whole
packed batch's [N_q, T, T] scores were 25.8 GB at the default score bounds). Traced (torch.export
with a symbolic T, where a loop over data-dependent lengths cannot be written): on CPU it calls
the registered op by name, so a compiled CPU package runs this same eager loop through
AOTInductor's proxy executor (a loading process registers it: ops/custom.py); elsewhere it calls
scaled_dot_product_attention with the block-diagonal causal mask: one [T, T] bool, which the
CUDA SDPA kernels block internally (on CPU Inductor lowers it to the math form, [N_q, T, T]
FP32 scores: 23 GB for a 4-head model at 64 x 512 tokens, hence the op call there).

Triton kernel (FlashAttention-2 forward, varlen):
- One program per (query block, query head). Query blocks are sequence-aligned: sequence s owns
  cdiv(L_s, BLOCK_M) blocks, so no block straddles two sequences and no key tile is wasted on
  a neighbour. The grid is sized from an upper bound, cdiv(T, BLOCK_M) + B, which needs no
  host sync (T and B are shapes; export/AOTInductor keep them symbolic); each program finds its
  (sequence, block) from a cumulative sum of per-sequence block counts over cu_seqlens (one
  vector load for B <= 64), and spare programs run empty loops and masked stores. Each
  sequence's last (heaviest) block runs first.
- Keys are visited in BLOCK_N tiles from the sequence start to the block's last row: tiles
  wholly at or before the block's first row skip the causal mask, the rest apply it.
- scores = q @ k^T in the input dtype with FP32 accumulation, online softmax in FP32 (exp2 with
  scale * log2(e) folded in), p cast to v's dtype for p @ v, FP32 accumulator.
- Any strides with a contiguous head dim: the model passes v as a view of the fused qkv output.
- FP32 inputs use IEEE dots (no TF32) so the FP32 lowering stays exact enough to validate.
- `pack` query heads of one K/V head can share a program (lowering `triton_gqa`, FlashAttention-3's
  "pack GQA"): the tile's rows interleave BLOCK_M tokens and the pack's heads (row r: token r // pack,
  head r % pack), so each key tile is read once for the group instead of once a head, and the dots
  have pack times the rows. The mask and the sequence bounds follow each row's token.
- `triton_stacked` (kernel in ops/packed_attention_stacked.py, op `boundgen::packed_attention_stacked`):
  128-row tiles for Hopper's wgmma, the pack's heads stacked as 64-row slabs, an unmasked key loop off
  the diagonal, the heaviest query blocks first; that module's docstring says why.

Flash lowering (`flash`): PyTorch's own FlashAttention-2 varlen forward
(`aten._flash_attention_forward`, CUDA, bf16/fp16; AOTInductor calls it through its C shim, so a
package needs no custom op). Its grid is cdiv(max_seqlen, 128) x B x N_q, and programs past a
sequence's end return at once, so it needs a tight `max_seqlen`: every lowering takes the
program's bound on a real sequence (the packer refuses longer ones), which the model passes.
Rows of a longer sequence are not written: only padding can be longer (score's filler sequence
of up to token_bucket - 1 tokens, whose score row is dropped), and beam's tail after the last
sequence is never written either; neither is read by a real row. Without a bound (None) it
uses T, correct but slow. On CPU or in FP32 (which FlashAttention lacks) it runs `reference`.
"""

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton



def sequence_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[T] index of the sequence each packed token belongs to."""
    idx = torch.arange(num_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    # The number of sequences ending at or before each token (cu_seqlens[0] = 0 counts for none).
    # Not searchsorted over cu_seqlens[1:]: under export that guards B >= 2 when the example has
    # B = 2 (a contiguity check of the slice), and a one-sequence call then fails.
    return (idx[:, None] >= cu_seqlens[None, :]).sum(dim=1) - 1  # [T]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
              scale: float, max_seqlen: int | None = None) -> torch.Tensor:
    """`max_seqlen` (every lowering takes it; only `flash` needs it) is not used here."""
    if torch.compiler.is_compiling():
        if q.device.type == "cpu":  # one sequence at a time, as below, called by the package by name
            return torch.ops.boundgen.packed_attention(q, k, v, cu_seqlens, scale)
        return _reference_traced(q, k, v, cu_seqlens, scale)
    out = torch.zeros_like(q)  # tokens after the last sequence (beam padding) belong to none: zeros
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out[start:end] = _attend_causal(q[start:end], k[start:end], v[start:end], scale)
    return out


def _attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal GQA attention within one sequence: q [L, N_q, D], k/v [L, N_kv, D] -> [L, N_q, D]."""
    length, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    qg = q.reshape(length, num_kv_heads, group, head_dim).to(torch.float32)  # [L, Nkv, G, D]
    scores = torch.einsum("ikgd,jkd->kgij", qg, k.to(torch.float32)) * scale  # [Nkv, G, L, L]
    idx = torch.arange(length, device=q.device)
    scores = scores.masked_fill(idx[None, :] > idx[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgij,jkd->ikgd", probs, v.to(torch.float32))  # [L, Nkv, G, D]
    return out.reshape(length, num_q_heads, head_dim).to(q.dtype)


def _reference_traced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """The same attention as one SDPA call under a [T, T] block-diagonal causal mask (export-friendly)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    seq = sequence_ids(cu_seqlens, num_tokens)
    idx = torch.arange(num_tokens, device=q.device)
    allowed = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])  # [T, T]
    group = num_q_heads // num_kv_heads  # K/V expanded per query head: [T, N_q, D] is small beside [T, T]
    k = k.repeat_interleave(group, dim=1) if group > 1 else k
    v = v.repeat_interleave(group, dim=1) if group > 1 else v
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).to(torch.float32), k.transpose(0, 1).to(torch.float32),
        v.transpose(0, 1).to(torch.float32), attn_mask=allowed, scale=scale)  # [N_q, T, D]
    return out.transpose(0, 1).to(q.dtype)


def reference_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """The semantics written over the whole packed batch ([N_q, T, T] scores): tests compare with it."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim).to(torch.float32)  # [T, Nkv, G, D]
    scores = torch.einsum("ikgd,jkd->kgij", qg, k.to(torch.float32)) * scale  # [Nkv, G, T, T]
    seq = sequence_ids(cu_seqlens, num_tokens)
    idx = torch.arange(num_tokens, device=q.device)
    allowed = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])  # [T, T]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgij,jkd->ikgd", probs, v.to(torch.float32))  # [T, Nkv, G, D]
    return out.reshape(num_tokens, num_q_heads, head_dim).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b with FP32 accumulation; IEEE for FP32 operands (else TF32 on the GPU)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend_key_tiles(acc, l_i, m_i, q, k_ptr, v_ptr, stride_kt, stride_vt, offs_m, offs_d,
                      lo, hi, qk_scale, BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                      IEEE: tl.constexpr):
    """Online-softmax update of (acc [M, D], l_i [M], m_i [M]) over keys [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_range = offs_n < hi
        k = tl.load(k_ptr + offs_n[None, :] * stride_kt + offs_d[:, None],
                    mask=in_range[None, :], other=0.0)  # [D, N]
        # .to(fp32): Inductor passes a Python float argument as fp64 in AOTI builds.
        s = (_dot(q, k, IEEE) * qk_scale).to(tl.float32)  # [M, N], log2 domain
        if CAUSAL_MASK:
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + offs_n[:, None] * stride_vt + offs_d[None, :],
                    mask=in_range[:, None], other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _packed_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_ptr, qk_scale, num_seqs,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SEQ_CHUNK: tl.constexpr, PACK: tl.constexpr):
    pid = tl.program_id(0)
    first_head = tl.program_id(1) * PACK  # PACK query heads of one K/V head a program
    kv_head = first_head // GROUP

    # Which (sequence, query block) is this program? Sequence s owns blocks
    # [sum_{r<s} n_r, sum_{r<=s} n_r), n_r = cdiv(L_r, BLOCK_M); scan cu_seqlens in vector chunks
    # (one chunk for B <= SEQ_CHUNK). At most one sequence matches, so sums pick its values.
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
        block += tl.sum(tl.where(mine, blocks_through - 1 - pid, 0))  # last block first
        blocks_before += tl.sum(num_blocks)
    # A spare program keeps seq_start = seq_end = 0: empty key loops, fully masked store.

    # Row r of the tile is token block_start + r // PACK of query head first_head + r % PACK: the
    # PACK heads that share a K/V head read each key tile once (PACK = 1: one head a program).
    block_start = seq_start + block * BLOCK_M
    rows = tl.arange(0, BLOCK_M * PACK)
    offs_m = block_start + rows // PACK  # [M * PACK] token of each row
    heads = first_head + rows % PACK  # [M * PACK] query head of each row
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_end
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)  # [M * PACK, D]
    k_ptr += kv_head * stride_kh
    v_ptr += kv_head * stride_vh

    acc = tl.zeros([BLOCK_M * PACK, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * PACK], dtype=tl.float32)
    m_i = tl.full([BLOCK_M * PACK], -1.0e30, dtype=tl.float32)  # finite: no NaN in masked rows
    # Key tiles wholly at or before the block's first row need no causal mask.
    unmasked_end = seq_start + ((block_start + 1 - seq_start) // BLOCK_N) * BLOCK_N
    keys_end = tl.minimum(block_start + BLOCK_M, seq_end)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_ptr, v_ptr, stride_kt, stride_vt,
                                      offs_m, offs_d, seq_start, unmasked_end, qk_scale,
                                      BLOCK_N, False, IEEE)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_ptr, v_ptr, stride_kt, stride_vt,
                                      offs_m, offs_d, unmasked_end, keys_end, qk_scale,
                                      BLOCK_N, True, IEEE)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + offs_m[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(q, k, v, cu_seqlens) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"packed_attention: expected q [T, N_q, D], k/v [T, N_kv, D]; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    num_tokens, num_q_heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f"packed_attention: k and v must both be [T={num_tokens}, N_kv, "
                         f"D={head_dim}]; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if num_q_heads % k.shape[1] != 0:
        raise ValueError(f"packed_attention: N_q={num_q_heads} is not a multiple of "
                         f"N_kv={k.shape[1]}")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"packed_attention: head_dim must be a power of two >= 16; got {head_dim}")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"packed_attention: q, k, v must share one dtype of bfloat16, float16, "
                         f"float32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("packed_attention: the head dim of q, k and v must be contiguous "
                         f"(stride 1); got strides {q.stride()}, {k.stride()}, {v.stride()}")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or not cu_seqlens.is_contiguous():
        raise ValueError("packed_attention: cu_seqlens must be a contiguous 1-D int32 tensor "
                         f"[B+1]; got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if not (q.device == k.device == v.device == cu_seqlens.device):
        raise ValueError(f"packed_attention: all inputs must be on one device; got q {q.device}, "
                         f"k {k.device}, v {v.device}, cu_seqlens {cu_seqlens.device}")


def default_config(head_dim: int, pack: int = 1) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Fixed, not autotuned: deterministic builds.
    BLOCK_M 64 keeps the padding waste of short sequences (48-256 tokens) small. Chosen from
    sm_90 register counts (ptxas, bf16): D 128 with 64 x 64 tiles and 4 warps spills, 64 x 32
    uses 206 registers without spilling; D 64 with 64 x 64 uses 230. The kernel benchmark
    sweeps alternatives. Packing `pack` heads a program keeps the tile's rows (BLOCK_M x pack)
    where one head's are, so BLOCK_M counts tokens: 64 / pack."""
    if head_dim <= 32:
        block_m, block_n = 32, 32
    elif head_dim <= 64:
        block_m, block_n = 64, 64
    else:
        block_m, block_n = 64, 32
    return max(block_m // pack, 16), block_n, 4, 2


def gqa_pack(num_q_heads: int, num_kv_heads: int) -> int:
    """Query heads a program of the `triton_gqa` lowering takes: the whole group that shares a
    K/V head (FlashAttention-3's "pack GQA"), where the tile's rows stay a power of two."""
    group = num_q_heads // num_kv_heads
    return group if group & (group - 1) == 0 and group <= 8 else 1


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
           scale: float, block_m: int | None = None, block_n: int | None = None,
           num_warps: int | None = None, num_stages: int | None = None, pack: int = 1) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. The launch config is
    overridable for tests (small blocks exercise multi-tile paths on tiny inputs) and benchmarks;
    `pack` query heads of one K/V head share a program (a power of two dividing the group)."""
    _check(q, k, v, cu_seqlens)
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // k.shape[1]
    if pack < 1 or pack & (pack - 1) or group % pack:
        raise ValueError(f"packed_attention: pack must be a power of two dividing the group of {group} query "
                         f"heads a K/V head; got {pack}")
    num_seqs = cu_seqlens.shape[0] - 1
    default_m, default_n, default_warps, default_stages = default_config(head_dim, pack)
    block_m, block_n = block_m or default_m, block_n or default_n
    num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(num_tokens, block_m) + num_seqs, num_q_heads // pack)
    wrap_triton(_packed_attention_kernel)[grid](
        q, k, v, out, cu_seqlens, scale * math.log2(math.e), num_seqs,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32, SEQ_CHUNK=64, PACK=pack, num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::packed_attention", mutates_args=())
def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float, pack: int = 1) -> torch.Tensor:
    return launch(q, k, v, cu_seqlens, scale, pack=pack)


@packed_attention.register_kernel("cpu")
def _(q, k, v, cu_seqlens, scale, pack=1):
    return reference(q, k, v, cu_seqlens, scale)


@packed_attention.register_fake
def _(q, k, v, cu_seqlens, scale, pack=1):
    return q.new_empty(q.shape)


def stacked_config(head_dim: int, pack: int) -> tuple[int, int, int, int]:
    """(BLOCK_M tokens, BLOCK_N, num_warps, num_stages) of the `triton_stacked` kernel: tiles of
    BLOCK_M x pack = 128 rows (ops/packed_attention_stacked.py says why), a warpgroup per 64 rows.
    Chosen from sm_90 compiles (ptxas, bf16, D 128, pack 2, 8 warps), before a GPU sweep: BLOCK_N 32
    takes 120 registers and 64 KB of shared memory at 2 stages, so two programs fit an SM; BLOCK_N 64
    takes 173 (one program an SM); 4 warps on 128 rows spill. `--packed-sweep stacked` times the rest."""
    block_m = max(128 // pack, 16)
    return block_m, min(block_m, 32 if head_dim >= 128 else 64), 4 * max(block_m * pack // 64, 1), 2


def launch_stacked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                   block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                   num_stages: int | None = None, pack: int | None = None, tma: bool = False) -> torch.Tensor:
    """The `triton_stacked` kernel; same signature and result as `reference`. `pack` query heads of
    one K/V head share a program, their rows stacked (default: gqa_pack); BLOCK_M counts tokens and
    BLOCK_N must divide it. The launch config is overridable for tests and benchmarks; `tma` (off
    the diagonal, K/V through tensor descriptors) needs triton.set_allocator on a GPU."""
    _check(q, k, v, cu_seqlens)
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // k.shape[1]
    pack = gqa_pack(num_q_heads, k.shape[1]) if pack is None else pack
    if pack < 1 or pack & (pack - 1) or group % pack:
        raise ValueError(f"packed_attention: pack must be a power of two dividing the group of {group} query "
                         f"heads a K/V head; got {pack}")
    default_m, default_n, default_warps, default_stages = stacked_config(head_dim, pack)
    block_m, block_n = block_m or default_m, block_n or default_n
    num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
    if block_n < 16 or block_m % block_n or block_m & (block_m - 1) or block_n & (block_n - 1):
        raise ValueError(f"packed_attention: BLOCK_N must be a power of two >= 16 dividing BLOCK_M; got BLOCK_M "
                         f"{block_m}, BLOCK_N {block_n}")
    num_seqs = cu_seqlens.shape[0] - 1
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    grid = (num_q_heads // pack, triton.cdiv(num_tokens, block_m) + num_seqs)
    # imported where launched: a package that calls packed_attention alone imports only its own kernels
    from boundgen.ops.packed_attention_stacked import _packed_attention_stacked_kernel

    wrap_triton(_packed_attention_stacked_kernel)[grid](
        q, k, v, out, cu_seqlens, scale * math.log2(math.e), num_seqs, num_tokens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, PACK=pack,
        IEEE=q.dtype == torch.float32, SOFT_BF16=q.device.type == "cpu", SEQ_CHUNK=64, TMA=tma,
        num_warps=num_warps, num_stages=num_stages)
    return out


@triton_op("boundgen::packed_attention_stacked", mutates_args=())
def packed_attention_stacked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                             scale: float) -> torch.Tensor:
    return launch_stacked(q, k, v, cu_seqlens, scale)


@packed_attention_stacked.register_kernel("cpu")
def _(q, k, v, cu_seqlens, scale):
    return reference(q, k, v, cu_seqlens, scale)


@packed_attention_stacked.register_fake
def _(q, k, v, cu_seqlens, scale):
    return q.new_empty(q.shape)


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                     max_seqlen: int | None = None) -> torch.Tensor:
    """The registered op (the grid needs no bound on a sequence's length)."""
    return packed_attention(q, k, v, cu_seqlens, scale)


def triton_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                         max_seqlen: int | None = None) -> torch.Tensor:
    """The registered op with a K/V head's query heads in one program (gqa_pack)."""
    return packed_attention(q, k, v, cu_seqlens, scale, gqa_pack(q.shape[1], k.shape[1]))


def triton_stacked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                             scale: float, max_seqlen: int | None = None) -> torch.Tensor:
    """The registered stacked-heads op (ops/packed_attention_stacked.py): 128-row tiles for wgmma."""
    return packed_attention_stacked(q, k, v, cu_seqlens, scale)


# ---------------------------------------------------------------------------------------------
# FlashAttention-2 (PyTorch's)

FLASH_DTYPES = (torch.bfloat16, torch.float16)


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
          max_seqlen: int | None = None) -> torch.Tensor:
    """PyTorch's FlashAttention-2 varlen forward; `reference` where it does not run (module doc)."""
    if q.device.type != "cuda" or q.dtype not in FLASH_DTYPES:
        return reference(q, k, v, cu_seqlens, scale)
    longest = q.shape[0] if max_seqlen is None else max_seqlen
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, longest, longest, 0.0, True,
                                                   False, scale=scale)[0]


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": triton_attention, "triton_gqa": triton_gqa_attention,
                   "triton_stacked": triton_stacked_attention, "flash": flash}
