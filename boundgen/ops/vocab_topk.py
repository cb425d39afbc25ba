"""Per-row top K over the vocabulary with FP32 log-softmax values: the expansion step of beam search.

    logits [M, V] (model dtype), bias [V] FP32 or None (-inf on tokens barred by min_new_tokens), k
    -> logp [M, k] FP32, ids [M, k] int64, best first:
    ids  = top k of (logits + bias) per row (the order the program ranks candidates by)
    logp = (log_softmax(logits in FP32) + bias)[ids]  (HF: log-softmax, then the processors)
    (no bias: nothing added; the program passes None when no token can be barred)

The reference is what the beam program computed before this op existed: `torch.topk` over the
row, then a gather from the full [M, V] FP32 log-softmax. On the H200 that pair cost ~0.4 ms per
decode step at M = 100 rows (a radix select in three launches plus a one-program-per-row
softmax reduction) and grows linearly with the requests batched into one call
(docs/benchmarks.md, session 3). Bytes moved by the kernel: the logits once (2 M V bytes in
bf16), bias once per program from L2, M x chunks x KP int64 keys written and read back.

Triton kernel, two launches:
- chunks: one program per (row, chunk of CHUNK columns). It loads the chunk, computes its max m
  and sum exp(x - m) (the log-softmax statistics, unbiased logits), and keeps the chunk's top KP
  (K padded to a power of two) of the biased logits with `tl.topk`. Each value travels as one
  int64 key: the FP32 bits made order-preserving as a signed int in the high half, 2^31 - 1 - col
  in the low half, so equal values rank the lower column first and the column comes back with
  the value.
- merge: one program per row over its chunks' keys (chunks x KP, padded): the top KP keys, the
  row's log-sum-exp from the chunks' statistics, and for the first K the logit reloaded by column
  -> logp = (x - max) - log(sum) + bias.
CHUNK is chosen so that the merge sees at most MERGE_KEYS keys (chunks padded to a power of two,
times KP): V = 151,936 and K = 200 (KP 256) give 19 chunks of 8,192; K = 300 (KP 512), 10 of
16,384. The top K is exact; ties between equal logits rank the lower
column first (torch.topk leaves their order unspecified), and the log-sum-exp sums in another
order than torch's, so logp can differ from the reference's in the last FP32 bits.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

MERGE_KEYS = 8192  # keys one merge program ranks: 64 KiB of int64


def reference(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.topk(logits if bias is None else logits + bias.to(logits.dtype), k, dim=-1).indices
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return (logp if bias is None else logp + bias).gather(-1, ids), ids


# ---------------------------------------------------------------------------------------------
# Triton kernels

@triton.jit
def _order_key(value, cols):
    """FP32 values and their columns -> int64 keys ordered as (value, -column)."""
    bits = value.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)


@triton.jit
def _chunk_topk_kernel(logits_ptr, bias_ptr, keys_ptr, max_ptr, sum_ptr, vocab, stride_row, num_chunks,
                       CHUNK: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = cols < vocab
    x = tl.load(logits_ptr + row * stride_row + cols, mask=valid, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - m), axis=0)
    ranked = x
    if HAS_BIAS:
        ranked += tl.load(bias_ptr + cols, mask=valid, other=0.0)
    top = tl.topk(_order_key(ranked, cols), KP)
    slot = row * num_chunks + chunk
    tl.store(keys_ptr + slot * KP + tl.arange(0, KP), top)
    tl.store(max_ptr + slot, m)
    tl.store(sum_ptr + slot, s)


@triton.jit
def _merge_kernel(keys_ptr, max_ptr, sum_ptr, logits_ptr, bias_ptr, logp_ptr, ids_ptr, stride_row, num_chunks, k,
                  CHUNKS_P2: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNKS_P2 * KP)
    keys = tl.load(keys_ptr + row * num_chunks * KP + offs, mask=offs < num_chunks * KP,
                   other=-9223372036854775807)
    top = tl.topk(keys, KP)
    cols = (0x7FFFFFFF - (top & 0xFFFFFFFF)).to(tl.int32)
    chunks = tl.arange(0, CHUNKS_P2)
    m_c = tl.load(max_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=float("-inf"))
    s_c = tl.load(sum_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    m = tl.max(m_c, axis=0)
    log_sum = tl.log(tl.sum(s_c * tl.exp(m_c - m), axis=0))
    out = tl.arange(0, KP)
    keep = out < k
    x = tl.load(logits_ptr + row * stride_row + cols, mask=keep, other=0.0).to(tl.float32)
    logp = (x - m) - log_sum
    if HAS_BIAS:
        logp += tl.load(bias_ptr + cols, mask=keep, other=0.0)
    tl.store(logp_ptr + row * k + out, logp, mask=keep)
    tl.store(ids_ptr + row * k + out, cols.to(tl.int64), mask=keep)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"vocab_topk: expected logits [M, V] with contiguous rows; got shape "
                         f"{tuple(logits.shape)}, strides {logits.stride()}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"vocab_topk: logits must be bfloat16, float16 or float32; got {logits.dtype}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (logits.shape[1],)
                             or bias.stride(0) != 1):
        raise ValueError(f"vocab_topk: bias must be contiguous FP32 [V={logits.shape[1]}]; got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"vocab_topk: k must be in 1..V={logits.shape[1]}; got {k}")


def default_chunk(vocab: int, kp: int) -> int:
    """Columns per chunk program: a power of two >= KP such that a row's chunks, padded to a power
    of two, hold at most MERGE_KEYS keys (or one chunk when KP alone is that many)."""
    max_chunks = max(1, MERGE_KEYS // kp)
    return max(kp, triton.next_power_of_2(triton.cdiv(vocab, max_chunks)))


def launch(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int, chunk: int | None = None,
           num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernels; same signature and result as `reference` (ties aside). `chunk`
    (a power of two >= K padded) is overridable for tests, so that tiny vocabularies span chunks."""
    _check(logits, bias, k)
    rows, vocab = logits.shape
    kp = max(2, triton.next_power_of_2(k))  # tl.topk of one element would be a scalar
    chunk = chunk or default_chunk(vocab, kp)
    if chunk < kp or chunk & (chunk - 1):
        raise ValueError(f"vocab_topk: chunk must be a power of two >= {kp}; got {chunk}")
    num_chunks = triton.cdiv(vocab, chunk)
    warps = num_warps or (8 if chunk >= 4096 else 4)
    keys = torch.empty((rows, num_chunks, kp), dtype=torch.int64, device=logits.device)
    stats = torch.empty((2, rows, num_chunks), dtype=torch.float32, device=logits.device)
    logp = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((rows, k), dtype=torch.int64, device=logits.device)
    bias_ptr = stats if bias is None else bias  # an FP32 tensor the kernels never read without a bias
    wrap_triton(_chunk_topk_kernel)[(rows, num_chunks)](
        logits, bias_ptr, keys, stats[0], stats[1], vocab, logits.stride(0), num_chunks, CHUNK=chunk, KP=kp,
        HAS_BIAS=bias is not None, num_warps=warps)
    wrap_triton(_merge_kernel)[(rows,)](
        keys, stats[0], stats[1], logits, bias_ptr, logp, ids, logits.stride(0), num_chunks, k,
        CHUNKS_P2=triton.next_power_of_2(num_chunks), KP=kp, HAS_BIAS=bias is not None, num_warps=warps)
    return logp, ids


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernels on CUDA, the reference on CPU.

@triton_op("boundgen::vocab_topk", mutates_args=())
def vocab_topk(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(logits, bias, k)


vocab_topk.register_kernel("cpu")(reference)


@vocab_topk.register_fake
def _(logits, bias, k):
    rows = logits.shape[0]
    return logits.new_empty((rows, k), dtype=torch.float32), logits.new_empty((rows, k), dtype=torch.int64)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": vocab_topk}
