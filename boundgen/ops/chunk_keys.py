"""Chunk maxima and the row log-sum-exp of logits: the one pass over the vocabulary that candidate
selection needs (ops/vocab_topk.py, lowering "chunks").

    logits [M, V] (model dtype), bias [V] FP32 or None, chunk (a power of two)
    -> keys [M, ceil(V / chunk)] int64, lse [M] FP32
    keys[r, c] = max over columns j of chunk c (j in [c * chunk, (c + 1) * chunk) and j < V) of
                 sort_key(logits[r, j] + bias[j], j)
    lse[r]     = logsumexp(logits[r] in FP32)   (the bias is not in it: HF adds it after the log-softmax)

sort_key(y, j) is one int64 per value that orders as "value descending, then column ascending":
the FP32 bits of y made order-preserving as a signed int32 (negative values' magnitude bits
flipped, -0.0 read as +0.0) in the high half, 2^31 - 1 - j in the low half. Keys are distinct, so
the top K chunks by key and the top K values by key are each one exact, tie-free answer.

Why chunks: a value of a row's top K lies in one of the row's top K chunks by key (if its chunk
were not among them, K other chunks would each hold a value ranked above it). So selection reads
the whole row once, here, and afterwards only K chunks of it (vocab_topk.select_from_chunks).

Triton kernel: a grid of (rows, segments); a program reads its segment of the row in tiles of
TILE_CHUNKS x CHUNK values, writes each chunk's key (a max along the tile's second axis) and keeps
an online max / sum of exp for the log-sum-exp, which it writes per segment; the launcher merges
the segments' partials. Many programs a row (10 segments of 16,384 columns over Qwen's 151,936)
keep the GPU's memory system busy even at 100 rows, where one program a row (the "triton"
lowering) is latency-bound. Bytes: the logits once, the bias once, V / chunk int64 keys written
(1/8 of the bf16 row at chunk 32).

The reference is the same computation in plain torch (it materialises every value's key: fine for
tests and CPU builds, where it is the registered op's CPU kernel).
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

LOW_BITS = 0x7FFFFFFF  # the low half of a key: 2^31 - 1 - column
NO_KEY = -(2 ** 63)  # below every key (columns past V)


def sort_keys(values: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """values (FP32) and their columns (int64), same shape -> int64 keys: value descending, then
    column ascending."""
    values = torch.where(values == 0, torch.zeros_like(values), values)  # -0.0 == +0.0: one key
    bits = values.contiguous().view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ LOW_BITS)
    return (ordered.to(torch.int64) << 32) | (LOW_BITS - cols)


def key_columns(keys: torch.Tensor) -> torch.Tensor:
    """The column of each key (int64)."""
    return LOW_BITS - (keys & LOW_BITS)


def reference(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    chunks = -(-vocab // chunk)
    x = logits.to(torch.float32)
    values = x if bias is None else x + bias
    cols = torch.arange(vocab, device=logits.device)
    keys = sort_keys(values, cols.expand(rows, vocab))
    padded = torch.full((rows, chunks * chunk), NO_KEY, dtype=torch.int64, device=logits.device)
    padded[:, :vocab] = keys
    return padded.view(rows, chunks, chunk).amax(dim=-1), torch.logsumexp(x, dim=-1)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _chunk_keys_kernel(logits_ptr, bias_ptr, keys_ptr, max_ptr, sum_ptr, vocab, chunks, stride_row, segment,
                       CHUNK: tl.constexpr, TILE_CHUNKS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    segments = tl.num_programs(1)
    row_ptr = logits_ptr + row * stride_row
    tile_chunk = tl.arange(0, TILE_CHUNKS)
    lane = tl.arange(0, CHUNK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    first = seg * segment
    for start in tl.range(first, tl.minimum(first + segment, vocab), TILE_CHUNKS * CHUNK, num_stages=STAGES):
        cols = start + tile_chunk[:, None] * CHUNK + lane[None, :]  # [TILE_CHUNKS, CHUNK]
        valid = cols < vocab
        x = tl.load(row_ptr + cols, mask=valid, other=float("-inf")).to(tl.float32)
        y = x
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols, mask=valid, other=0.0)
        y = tl.where(y == 0.0, 0.0, y)
        bits = y.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)
        key = tl.where(valid, key, -9223372036854775807 - 1)
        chunk_ids = start // CHUNK + tile_chunk
        tl.store(keys_ptr + row * chunks + chunk_ids, tl.max(key, axis=1), mask=chunk_ids < chunks)
        # Online log-sum-exp: m the running max, s the sum of exp(x - m) (0 - -inf guarded).
        m_new = tl.maximum(m, tl.max(tl.max(x, axis=1), axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.sum(tl.exp(x - shift), axis=1), axis=0)
        m = m_new
    tl.store(max_ptr + row * segments + seg, m)
    tl.store(sum_ptr + row * segments + seg, s)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEFAULT_TILE, DEFAULT_SEGMENT, DEFAULT_WARPS, DEFAULT_STAGES = 2048, 16384, 4, 2


def check(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"chunk_keys: expected logits [M, V] with contiguous rows; got shape "
                         f"{tuple(logits.shape)}, strides {logits.stride()}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"chunk_keys: logits must be bfloat16, float16 or float32; got {logits.dtype}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (logits.shape[1],)
                             or bias.stride(0) != 1):
        raise ValueError(f"chunk_keys: bias must be contiguous FP32 [V={logits.shape[1]}]; got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"chunk_keys: chunk must be a power of two; got {chunk}")


def launch(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int, tile: int | None = None,
           segment: int | None = None, num_warps: int | None = None,
           stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; the reference's result. `tile` (values a loop step reads, a power of
    two >= chunk) and `segment` (columns a program reads, a multiple of tile) are overridable for
    tests (small rows over several segments) and the benchmark's sweep."""
    check(logits, bias, chunk)
    rows, vocab = logits.shape
    tile = max(tile or DEFAULT_TILE, chunk)
    segment = segment or DEFAULT_SEGMENT
    if tile & (tile - 1) or segment % tile:
        raise ValueError(f"chunk_keys: tile must be a power of two >= chunk and segment a multiple of it; "
                         f"got tile {tile}, segment {segment}")
    chunks, segments = triton.cdiv(vocab, chunk), triton.cdiv(vocab, segment)
    keys = torch.empty((rows, chunks), dtype=torch.int64, device=logits.device)
    seg_max = torch.empty((rows, segments), dtype=torch.float32, device=logits.device)
    seg_sum = torch.empty((rows, segments), dtype=torch.float32, device=logits.device)
    bias_ptr = seg_max if bias is None else bias  # an FP32 tensor the kernel never reads without a bias
    wrap_triton(_chunk_keys_kernel)[(rows, segments)](
        logits, bias_ptr, keys, seg_max, seg_sum, vocab, chunks, logits.stride(0), segment,
        CHUNK=chunk, TILE_CHUNKS=tile // chunk, HAS_BIAS=bias is not None,
        STAGES=stages or DEFAULT_STAGES, num_warps=num_warps or DEFAULT_WARPS)
    row_max = seg_max.amax(dim=1, keepdim=True)
    shift = torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)
    lse = shift[:, 0] + torch.log((seg_sum * torch.exp(seg_max - shift)).sum(dim=1))
    return keys, lse


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::chunk_keys", mutates_args=())
def chunk_keys(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(logits, bias, chunk)


chunk_keys.register_kernel("cpu")(reference)


@chunk_keys.register_fake
def _(logits, bias, chunk):
    rows, vocab = logits.shape
    return (logits.new_empty((rows, -(-vocab // chunk)), dtype=torch.int64),
            logits.new_empty((rows,), dtype=torch.float32))

