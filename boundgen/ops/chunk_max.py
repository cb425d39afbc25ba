"""Chunk maxima and the row log-sum-exp of logits: the one pass over the vocabulary that candidate
selection needs (ops/vocab_topk.py, lowering "chunks").

    logits [M, V] (model dtype), bias [V] FP32 or None, chunk (a power of two dividing V)
    -> maxima [M, V / chunk] (model dtype), lse [M] FP32
    maxima[r, c] = max of (logits + bias in the model dtype)[r, c * chunk : (c + 1) * chunk]
    lse[r]       = logsumexp(logits[r] in FP32)   (no bias in it: HF adds it after the log-softmax)

Why chunks: the row's top K values lie in its top K chunks by maximum (any K chunks whose maxima
are >= the K-th chunk maximum hold K values >= it, and every value above it sits in a chunk whose
maximum is above it). So selection reads the whole row once, here, and afterwards only K chunks of
it (vocab_topk.select_from_chunks). Equal maxima at the K-th place may pick either chunk; the
result is then a top K in another tie order, as torch.topk's own.

Triton kernel: a grid of (rows, segments); a program reads its segment of the row in tiles of
TILE_CHUNKS x CHUNK values, writes each chunk's maximum (a max along the tile's second axis) and
keeps an online max / sum of exp for the log-sum-exp, which it writes per segment; the launcher
merges the segments' partials. Many programs a row (10 segments of 16,384 columns over Qwen's
151,936) keep the GPU's memory system busy even at 100 rows, where one program a row (the "triton"
lowering) is latency-bound. Bytes: the logits once, the bias once, V / chunk maxima written (1/32
of the row at chunk 32).

The reference is the same computation in plain torch (the registered op's CPU kernel).
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


def biased(logits: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """logits + bias in the model dtype: what selection ranks (as the reference lowering does)."""
    return logits if bias is None else logits + bias.to(logits.dtype)


def chunk_values(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk_ids: torch.Tensor,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns [M, k x chunk] of chunks `chunk_ids` [M, k] (in their order) and the values
    there as selection ranks them (`biased`). Columns are clamped into the row: a no-op on real
    data that lets Inductor drop its index bound check (it tunes kernels on made-up indices)."""
    rows, vocab = logits.shape
    cols = (chunk_ids[:, :, None] * chunk + torch.arange(chunk, device=logits.device)).reshape(rows, -1)
    cols = cols.clamp(0, vocab - 1)
    values = logits.gather(1, cols)
    return cols, values if bias is None else values + bias[cols].to(values.dtype)


def reference(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    maxima = biased(logits, bias).view(rows, vocab // chunk, chunk).amax(dim=-1)
    return maxima, torch.logsumexp(logits.to(torch.float32), dim=-1)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _chunk_max_kernel(logits_ptr, bias_ptr, maxima_ptr, max_ptr, sum_ptr, vocab, chunks, stride_row, segment,
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
        raw = tl.load(row_ptr + cols, mask=valid, other=float("-inf"))
        x = raw.to(tl.float32)
        y = raw
        if HAS_BIAS:  # in the model dtype, as the reference ranks (the bias is 0 or -inf: exact)
            y = (x + tl.load(bias_ptr + cols, mask=valid, other=0.0)).to(raw.dtype)
        chunk_ids = start // CHUNK + tile_chunk
        tl.store(maxima_ptr + row * chunks + chunk_ids, tl.max(y, axis=1), mask=chunk_ids < chunks)
        # Online log-sum-exp: m the running max, s the sum of exp(x - m) (-inf - -inf guarded).
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


def check_logits(op: str, logits: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """The logits and bias every selection op reads (chunk_max, chunk_select, vocab_topk); `op`
    names the op in the message."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"{op}: expected logits [M, V] with contiguous rows; got shape "
                         f"{tuple(logits.shape)}, strides {logits.stride()}")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{op}: logits must be bfloat16, float16 or float32; got {logits.dtype}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (logits.shape[1],)
                             or bias.stride(0) != 1):
        raise ValueError(f"{op}: bias must be contiguous FP32 [V={logits.shape[1]}]; got {bias.dtype} "
                         f"{tuple(bias.shape)}")


def check(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> None:
    check_logits("chunk_max", logits, bias)
    if chunk < 1 or chunk & (chunk - 1) or logits.shape[1] % chunk:
        raise ValueError(f"chunk_max: chunk must be a power of two dividing V={logits.shape[1]}; got {chunk}")


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
        raise ValueError(f"chunk_max: tile must be a power of two >= chunk and segment a multiple of it; "
                         f"got tile {tile}, segment {segment}")
    chunks, segments = vocab // chunk, triton.cdiv(vocab, segment)
    maxima = torch.empty((rows, chunks), dtype=logits.dtype, device=logits.device)
    seg_max = torch.empty((rows, segments), dtype=torch.float32, device=logits.device)
    seg_sum = torch.empty((rows, segments), dtype=torch.float32, device=logits.device)
    bias_ptr = seg_max if bias is None else bias  # an FP32 tensor the kernel never reads without a bias
    wrap_triton(_chunk_max_kernel)[(rows, segments)](
        logits, bias_ptr, maxima, seg_max, seg_sum, vocab, chunks, logits.stride(0), segment,
        CHUNK=chunk, TILE_CHUNKS=tile // chunk, HAS_BIAS=bias is not None,
        STAGES=stages or DEFAULT_STAGES, num_warps=num_warps or DEFAULT_WARPS)
    row_max = seg_max.amax(dim=1, keepdim=True)
    shift = torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)
    lse = shift[:, 0] + torch.log((seg_sum * torch.exp(seg_max - shift)).sum(dim=1))
    return maxima, lse


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::chunk_max", mutates_args=())
def chunk_max(logits: torch.Tensor, bias: Optional[torch.Tensor], chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(logits, bias, chunk)


chunk_max.register_kernel("cpu")(reference)


@chunk_max.register_fake
def _(logits, bias, chunk):
    rows, vocab = logits.shape
    return logits.new_empty((rows, vocab // chunk)), logits.new_empty((rows,), dtype=torch.float32)
