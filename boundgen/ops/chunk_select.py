"""The top k of each row from its chunk maxima, in one kernel: the second half of candidate
selection by chunks (ops/vocab_topk.py, lowering "chunks-triton"; the first half is ops/chunk_max.py).

    logits [M, V] (model dtype), bias [V] FP32 or None, maxima [M, V / chunk] (model dtype,
    chunk_max's), lse [M] FP32, k, chunk (a power of two dividing V)
    -> logp [M, k] FP32, ids [M, k] int64, best first; ids ranked as a stable descending sort of
       logits + bias (in the model dtype): equal values, the lower column first; logp = the value
       - lse (= log_softmax + bias, as the reference lowering).

Exact in that order, ties included: rank chunks by (maximum descending, chunk index ascending);
a value of the row's top k lies in one of its top k chunks (if its chunk were not among them, the
maxima of k chunks ranked above would each rank above the value), and the top k chunks' values,
taken in column order, rank among themselves as in the row.

Triton kernel, one program a row, everything in registers but two small scratch rows:
1. the row's chunk maxima (V / chunk of them, padded to NCP) as order-preserving keys; the k-th
   largest key by radix select (ops/radix.py: four passes of 8-bit digit histograms); the chunks
   above it and, of those equal to it, the lowest-indexed, compacted in index order into scratch;
2. the k chunks' values ([KP, chunk], ascending columns), the k-th largest again, the top k
   compacted as int64 sort keys (key << 32 | 2^31 - 1 - column) into scratch, sorted (KP of them)
   and decoded.
Bytes: the chunk maxima and k x chunk values of a row (1/32 + k x 32 / V of the logits at chunk
32: ~7% for k = 200 over Qwen's vocabulary), where two `torch.topk` passes launch several kernels
each and sort more.

The reference is the same selection in torch (stable sorts): the registered op's CPU kernel.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops.chunk_max import check_logits, chunk_values
from boundgen.ops.radix import ordered_key, top_k_mask

MAX_BLOCK = 16384  # values a program holds at once (chunk maxima, or k x chunk candidates)


def reference(logits: torch.Tensor, bias: Optional[torch.Tensor], maxima: torch.Tensor, lse: torch.Tensor, k: int,
              chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    top_chunks = torch.sort(maxima, dim=-1, descending=True, stable=True).indices[:, :k]
    top_chunks = torch.sort(top_chunks, dim=-1).values  # index order: candidates in column order
    cols, values = chunk_values(logits, bias, top_chunks, chunk)
    best = torch.sort(values, dim=-1, descending=True, stable=True)
    return best.values[:, :k].to(torch.float32) - lse[:, None], cols.gather(1, best.indices[:, :k])


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _chunk_select_kernel(logits_ptr, bias_ptr, maxima_ptr, lse_ptr, chunk_buf_ptr, key_buf_ptr, logp_ptr, ids_ptr,
                         chunks, stride_row, k, CHUNK: tl.constexpr, NCP: tl.constexpr, KP: tl.constexpr,
                         HAS_BIAS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dtype = logits_ptr.dtype.element_ty

    # 1. The top k chunks, in index order.
    idx = tl.arange(0, NCP)
    valid = idx < chunks
    key = ordered_key(tl.load(maxima_ptr + row * chunks + idx, mask=valid, other=float("-inf")).to(tl.float32))
    take = top_k_mask(key, valid, k)
    tl.store(chunk_buf_ptr + row * KP + tl.cumsum(take.to(tl.int32), axis=0) - 1, idx, mask=take)
    tl.debug_barrier()  # the chunk list visible to every thread

    # 2. Their values in column order; the top k of them, sorted.
    slot = tl.arange(0, KP)
    chunk_ids = tl.load(chunk_buf_ptr + row * KP + slot, mask=slot < k, other=0)
    cols = tl.reshape(chunk_ids[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :], [KP * CHUNK])
    inside = tl.reshape(tl.broadcast_to((slot < k)[:, None], [KP, CHUNK]), [KP * CHUNK])
    x = tl.load(logits_ptr + row * stride_row + cols, mask=inside, other=float("-inf"))
    y = x.to(tl.float32)
    if HAS_BIAS:  # in the model dtype, as the reference ranks (the bias is 0 or -inf: exact)
        y = (y + tl.load(bias_ptr + cols, mask=inside, other=0.0)).to(dtype).to(tl.float32)
    key = ordered_key(y)
    take = top_k_mask(key, inside, k)
    sort_key = (key.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)
    tl.store(key_buf_ptr + row * KP + tl.cumsum(take.to(tl.int32), axis=0) - 1, sort_key, mask=take)
    tl.debug_barrier()
    best = tl.sort(tl.load(key_buf_ptr + row * KP + slot, mask=slot < k, other=-9223372036854775807 - 1),
                   descending=True)
    best_cols = 0x7FFFFFFF - (best & 0xFFFFFFFF)
    ordered = (best >> 32).to(tl.int32)
    value = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    keep = slot < k
    tl.store(logp_ptr + row * k + slot, value - tl.load(lse_ptr + row), mask=keep)
    tl.store(ids_ptr + row * k + slot, best_cols, mask=keep)


# ---------------------------------------------------------------------------------------------
# Launcher

def check(logits: torch.Tensor, bias: Optional[torch.Tensor], maxima: torch.Tensor, lse: torch.Tensor, k: int,
          chunk: int) -> None:
    check_logits("chunk_select", logits, bias)
    rows, vocab = logits.shape
    if chunk < 1 or chunk & (chunk - 1) or vocab % chunk:
        raise ValueError(f"chunk_select: chunk must be a power of two dividing V={vocab}; got {chunk}")
    if tuple(maxima.shape) != (rows, vocab // chunk) or maxima.dtype != logits.dtype or not maxima.is_contiguous():
        raise ValueError(f"chunk_select: maxima must be contiguous [{rows}, {vocab // chunk}] {logits.dtype}; got "
                         f"{tuple(maxima.shape)} {maxima.dtype}")
    if tuple(lse.shape) != (rows,) or lse.dtype != torch.float32:
        raise ValueError(f"chunk_select: lse must be FP32 [{rows}]; got {tuple(lse.shape)} {lse.dtype}")
    chunks, kp = vocab // chunk, triton.next_power_of_2(k)
    if not 1 <= k <= chunks or triton.next_power_of_2(chunks) > MAX_BLOCK or kp * chunk > MAX_BLOCK:
        raise ValueError(f"chunk_select: k={k} and chunk {chunk} need 1 <= k <= V / chunk = {chunks}, "
                         f"V / chunk and k x chunk (k to a power of two) within {MAX_BLOCK}")


DEFAULT_WARPS = 16  # sm_90 (ptxas, k 200, chunk 32): 255 registers and a 192-byte spill at 8 warps, 128 and 64 at
# 16, 64 and 40 at 32; one program an SM in each case (tests/ops/test_sm90_compile.py reports them)


def launch(logits: torch.Tensor, bias: Optional[torch.Tensor], maxima: torch.Tensor, lse: torch.Tensor, k: int,
           chunk: int, num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; the reference's result. `num_warps` overridable for the benchmark's sweep."""
    check(logits, bias, maxima, lse, k, chunk)
    rows, vocab = logits.shape
    kp = max(2, triton.next_power_of_2(k))
    chunk_buf = torch.empty((rows, kp), dtype=torch.int32, device=logits.device)
    key_buf = torch.empty((rows, kp), dtype=torch.int64, device=logits.device)
    logp = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((rows, k), dtype=torch.int64, device=logits.device)
    wrap_triton(_chunk_select_kernel)[(rows,)](
        logits, logp if bias is None else bias, maxima, lse, chunk_buf, key_buf, logp, ids, vocab // chunk,
        logits.stride(0), k, CHUNK=chunk, NCP=max(2, triton.next_power_of_2(vocab // chunk)), KP=kp,
        HAS_BIAS=bias is not None, num_warps=num_warps)
    return logp, ids


def chunk_width(vocab: int, k: int, preferred: int) -> int:
    """`preferred` (a chunk width that divides V into >= k chunks), halved while k x chunk is more
    than a program holds."""
    chunk = preferred
    while chunk > 1 and triton.next_power_of_2(k) * chunk > MAX_BLOCK:
        chunk //= 2
    return chunk


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::chunk_select", mutates_args=())
def chunk_select(logits: torch.Tensor, bias: Optional[torch.Tensor], maxima: torch.Tensor, lse: torch.Tensor, k: int,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(logits, bias, maxima, lse, k, chunk)


chunk_select.register_kernel("cpu")(reference)


@chunk_select.register_fake
def _(logits, bias, maxima, lse, k, chunk):
    rows = logits.shape[0]
    return logits.new_empty((rows, k), dtype=torch.float32), logits.new_empty((rows, k), dtype=torch.int64)
