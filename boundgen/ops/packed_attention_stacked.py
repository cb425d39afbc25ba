"""The Triton kernel of packed attention's `triton_stacked` lowering: wide tiles for Hopper's tensor cores.

Same semantics, shapes and FLOPs as ops/packed_attention.py (its docstring; `reference` there); that
module launches this kernel (`launch_stacked`) and registers it as `boundgen::packed_attention_stacked`.

Why another form. W1 runs sequences of 48-256 tokens (~170 on average): the `triton` / `triton_gqa`
kernels use 64-row tiles, BLOCK_N 32 and 4 warps, and reach ~10% of the BF16 peak. On sm_90 Triton
lowers tl.dot to wgmma (asynchronous warpgroup MMA, operands in shared memory) when a warpgroup's
tile has >= 64 rows; the loads are pipelined `num_stages` deep. Bigger tiles per sequence would pad
short sequences, so the rows come from the GQA group instead (FlashAttention-3's "pack GQA"):
- A program takes BLOCK_M tokens of one sequence for the PACK query heads that share a K/V head,
  stacked: row r is token r % BLOCK_M of query head first_head + r // BLOCK_M, so with 8 warps
  each warpgroup owns one head's 64 x D slab. BLOCK_M 64 and PACK 2 make a 128-row tile, each K/V
  tile read once for both heads, and padding of at most 63 tokens a sequence.
- Keys in BLOCK_N tiles (BLOCK_N divides BLOCK_M): the tiles before the block's first token are
  whole and in the sequence, so that loop has no mask at all (no bounds checks on the loads, no
  causal select); only the BLOCK_M / BLOCK_N tiles on the diagonal apply masks.
- K is loaded [N, D] (rows contiguous, as the tile sits in memory) and transposed in the dot.
- exp2 with scale * log2(e) folded into one multiply of the scores; FP32 softmax and accumulator.
- Heaviest work first: the grid's first axis is the K/V head pack (programs of one query block are
  neighbours), the second the query blocks in descending block index across all sequences (a
  block's work grows with its index), so the last wave holds the cheapest blocks rather than a
  long sequence's last block. The order is found in the kernel from cu_seqlens, one pass over the
  sequences (in SEQ_CHUNK vectors) per level of block index: no host sync, no schedule tensor.
- TMA (benchmark only, not the registered op): the off-diagonal K/V tiles come through tensor
  descriptors (tl.make_tensor_descriptor, triton >= 3.4: the copy engine, no address math in the
  warps); the diagonal's masked loads stay as they are, so no key outside the sequence is read. A
  descriptor made in the kernel needs global scratch: eager launches need triton.set_allocator
  (bench/kernels.py sets one), which is why the op leaves it off.
- SOFT_BF16 (the interpreter, whose bf16 tl.dot is wrong, triton-lang/triton#11584): the dots'
  operands are cast to FP32, so bf16 inputs can be tested on CPU.
"""

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr):
    """a @ b with FP32 accumulation; IEEE for FP32 operands (else TF32 on the GPU)."""
    if SOFT_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _update(acc, l_i, m_i, s, v, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Online softmax over one key tile: s [R, N] scores in the log2 domain, v [N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, SOFT_BF16)
    return acc, l_i, m_new


@triton.jit
def _packed_attention_stacked_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_ptr, qk_scale, num_seqs, num_tokens,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        PACK: tl.constexpr, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr, SEQ_CHUNK: tl.constexpr,
        TMA: tl.constexpr):
    first_head = tl.program_id(0) * PACK
    kv_head = first_head // GROUP
    # Which (sequence, query block) is work item pid? Blocks in descending block index (level),
    # sequences in order within a level; a spare pid keeps (0, 0, 0): empty loops, masked stores.
    # Written here, not in a helper: torch's analysis of what a kernel writes (a build clones what it
    # finds) takes every argument of a call whose result reaches a store's address as written, and
    # would clone cu_seqlens on every call (bench/mutations.py).
    pid = tl.program_id(1)
    levels = pid * 0
    for chunk in range(0, num_seqs, SEQ_CHUNK):
        idx = chunk + tl.arange(0, SEQ_CHUNK)
        valid = idx < num_seqs
        lengths = tl.load(cu_seqlens_ptr + idx + 1, mask=valid, other=0) - tl.load(
            cu_seqlens_ptr + idx, mask=valid, other=0)
        levels = tl.maximum(levels, tl.max(tl.cdiv(lengths, BLOCK_M)))
    seq_start = pid * 0
    seq_end = pid * 0
    block = pid * 0
    before = pid * 0  # work items of the levels above, then of this level's sequences before the chunk
    for step in range(0, levels):
        level = levels - 1 - step
        for chunk in range(0, num_seqs, SEQ_CHUNK):
            idx = chunk + tl.arange(0, SEQ_CHUNK)
            valid = idx < num_seqs
            starts = tl.load(cu_seqlens_ptr + idx, mask=valid, other=0)
            ends = tl.load(cu_seqlens_ptr + idx + 1, mask=valid, other=0)
            has = (tl.cdiv(ends - starts, BLOCK_M) > level).to(tl.int32)  # 0 where not valid
            mine = (has > 0) & (before + tl.cumsum(has, axis=0) - 1 == pid)  # one lane at most
            seq_start += tl.sum(tl.where(mine, starts, 0))
            seq_end += tl.sum(tl.where(mine, ends, 0))
            block += tl.sum(tl.where(mine, level, 0))
            before += tl.sum(has)
    block_start = seq_start + block * BLOCK_M

    rows = tl.arange(0, PACK * BLOCK_M)
    offs_m = block_start + rows % BLOCK_M  # [R] token of each row
    heads = first_head + rows // BLOCK_M  # [R] query head of each row
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_end
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)  # [R, D]
    k_ptr += kv_head * stride_kh
    v_ptr += kv_head * stride_vh
    if TMA:  # [T, D] views of this K/V head, read by the copy engine (the unmasked loop only)
        k_desc = tl.make_tensor_descriptor(k_ptr, shape=[num_tokens, HEAD_DIM], strides=[stride_kt, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(v_ptr, shape=[num_tokens, HEAD_DIM], strides=[stride_vt, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])

    acc = tl.zeros([PACK * BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([PACK * BLOCK_M], dtype=tl.float32)
    m_i = tl.full([PACK * BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: no NaN in masked rows
    # Off the diagonal: whole tiles of this sequence's keys before the block, no masks.
    for start_n in range(seq_start, block_start, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if TMA:
            k = k_desc.load([start_n, 0])
        else:
            k = tl.load(k_ptr + offs_n[:, None] * stride_kt + offs_d[None, :])  # [N, D]
        # .to(fp32): Inductor passes a Python float argument as fp64 in AOTI builds.
        s = (_dot(q, tl.trans(k), IEEE, SOFT_BF16) * qk_scale).to(tl.float32)  # [R, N], log2 domain
        if TMA:
            v = v_desc.load([start_n, 0])
        else:
            v = tl.load(v_ptr + offs_n[:, None] * stride_vt + offs_d[None, :])  # [N, D]
        acc, l_i, m_i = _update(acc, l_i, m_i, s, v, IEEE, SOFT_BF16)
    # The diagonal: keys [block_start, min(block_start + BLOCK_M, seq_end)), causal and bounds masks.
    keys_end = tl.minimum(block_start + BLOCK_M, seq_end)
    for start_n in range(block_start, keys_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_range = offs_n < keys_end
        k = tl.load(k_ptr + offs_n[:, None] * stride_kt + offs_d[None, :], mask=in_range[:, None], other=0.0)
        s = (_dot(q, tl.trans(k), IEEE, SOFT_BF16) * qk_scale).to(tl.float32)
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        v = tl.load(v_ptr + offs_n[:, None] * stride_vt + offs_d[None, :], mask=in_range[:, None], other=0.0)
        acc, l_i, m_i = _update(acc, l_i, m_i, s, v, IEEE, SOFT_BF16)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + offs_m[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
