"""Per-row top K over the vocabulary with FP32 log-softmax values: the expansion step of beam search.

    logits [M, V] (model dtype), bias [V] FP32 or None (-inf on tokens barred by min_new_tokens), k
    -> logp [M, k] FP32, ids [M, k] int64, best first:
    ids  = top k of (logits + bias) per row (the order the program ranks candidates by)
    logp = (log_softmax(logits in FP32) + bias)[ids]  (HF: log-softmax, then the processors)
    (no bias: nothing added; the program passes None when no token can be barred)

No full-vocabulary log-softmax or sort is needed: log_softmax(x)_i = x_i - lse(x) is monotone in
x_i within a row, so the top K by log-prob is the top K by logit, and one FP32 log-sum-exp per row
(max m, sum exp(x - m)) turns the K selected logits into log-probs.

The reference is what the beam program computed before this op existed: `torch.topk` over the
row, then a gather from the full [M, V] FP32 log-softmax. On the H200 the pair costs 422 / 2,330 /
4,466 us at M = 100 / 800 / 1,600 rows, K = 200, V = 151,936: 4-7x the LM-head GEMM that makes
the logits (measured on the H200). `reference_lse` is the cheap torch variant (top K of the
model-dtype logits, one FP32 log-sum-exp, no [M, V] FP32 log-softmax kept): same ids; logp equal
up to the rounding of the subtraction (a few FP32 ulp).

Triton kernel: one program per row: a threshold that provably lies at or below the K-th largest
value, the values above it collected, one small sort (the AIR top-k / FlashInfer filtered top-K
idea: filter, then sort few).
- key: each value y = x + bias as FP32, its bits made order-preserving as a signed int32
  (negative values' magnitude bits flipped; -0.0 read as +0.0, so equal values are equal keys).
- pass 1 (the whole row): per lane (column mod BLOCK) the max of the logits (-> the row max m)
  and the max key. K lanes hold a key >= the K-th largest lane max t0, so the row's K-th largest
  key is >= t0: a lower bound from BLOCK maxima (tl.topk of BLOCK int32), no histogram.
- pass 2 (the whole row): the keys >= t0 into a [M, CAP] scratch buffer as int64 sort keys
  (key << 32 | 2^31 - 1 - column: value descending, then column ascending), and the row's
  sum exp(x - m) (one exp per value). For values spread over the lanes (no lane holding many of
  the top K) about K keys pass; CAP = 2 x K padded leaves room.
- only if more than CAP keys passed (many of the top K in few lanes, or many equal values), a
  radix select narrows the key range [lo, hi] = [t0, max key], which holds the K-th largest key,
  with gt keys above it (0 at first) and n in it: while gt + n > CAP and the range holds more than
  one key, a pass histograms (key - lo) >> s over the range in BINS = 256 bins (s such that they
  span it) and keeps the bin of the K-th largest (256-fold narrower a pass: 1-2 passes reach a
  single bf16 value, at most 4 a single FP32 value; none when the row is one value); then a
  collect pass writes every key above hi and the keys in [lo, hi] up to CAP - gt in column order
  (all of them, unless the range is one value repeated more often: then its lowest columns,
  which is the tie order).
- sort: the <= CAP keys of the row (tl.sort), the first K decoded into columns and
  logp = (y - m) - log(sum).
The top K is exact on either path: the same ids as a stable descending sort of logits + bias
(equal values rank the lower column first; torch.topk leaves their order unspecified). NaN
logits are not supported.

Bytes moved: the logits twice per row (2 M V bytes each in bf16; the second pass mostly from L2:
one row is 304 KB), CAP int64 keys written and read per row, the bias once per pass from L2; the
radix select, when needed, reads the row 2-3 more times. Why the block sizes: BLOCK = 4,096
columns is both the load tile (8 values per thread at 16 warps, loads pipelined STAGES = 3 deep
with tl.range: a program per row is latency-bound, and the register use, 255 per thread at 8 warps
in ptxas for sm_90, allows one program per SM either way, so 16 warps keep more loads in flight)
and the lane count, which must be >= K for the bound (K <= 800 here) and gives t0 close to the
K-th value (for values spread evenly over lanes about K (1 + K/BLOCK/2) keys pass); BINS = 256
because Triton's histogram costs ~bins/32 operations per value a warp; CAP = 2 K. These are
choices from the design, not yet from measurement: the benchmark (bench/selection.py,
`bench_vocab_topk`) times SELECTION_SWEEP's BLOCK / warps / stages beside the default.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import chunk_max, chunk_select
from boundgen.ops.radix import masked_histogram, ordered_key, pick_bin

BINS = 256  # histogram bins per radix-select pass


def reference(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.topk(logits if bias is None else logits + bias.to(logits.dtype), k, dim=-1).indices
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return (logp if bias is None else logp + bias).gather(-1, ids), ids


def reference_lse(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference without the [M, V] FP32 log-softmax: top K of the model-dtype logits, then
    x - logsumexp(x) on the K selected only. Same ids; logp within a few FP32 ulp of `reference`."""
    top = torch.topk(logits if bias is None else logits + bias.to(logits.dtype), k, dim=-1)
    lse = torch.logsumexp(logits.to(torch.float32), dim=-1, keepdim=True)  # [M, 1]
    logp = logits.gather(-1, top.indices).to(torch.float32) - lse
    return (logp if bias is None else logp + bias[top.indices]), top.indices


# ---------------------------------------------------------------------------------------------
# Lowering "chunks": one pass over the row for chunk maxima and the log-sum-exp (ops/chunk_max.py),
# then torch.topk over the V / 32 chunk maxima and over the top K chunks' values only.

CHUNK = 32  # values per chunk: V / 32 chunk maxima a row (4,748 for Qwen), K x 32 candidates


def chunk_size(vocab: int, k: int, preferred: int = CHUNK) -> int:
    """The chunk width for (V, k): the largest power of two <= `preferred` that divides V into at
    least k chunks (1 for an odd V: then every value is its own chunk)."""
    chunk = preferred
    while chunk > 1 and (vocab % chunk or vocab // chunk < k):
        chunk //= 2
    return chunk


def select_from_chunks(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int, maxima: torch.Tensor,
                       lse: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's top k from its chunk maxima [M, V / chunk] and log-sum-exp [M] (chunk_max): the
    top k chunks by maximum hold a top k of the row, so only their k x chunk values are ranked."""
    top_chunks = torch.topk(maxima, k, dim=-1, sorted=False).indices  # [M, k]
    cols, values = chunk_max.chunk_values(logits, bias, top_chunks, chunk)
    best = torch.topk(values, k, dim=-1)  # best first
    ids = cols.gather(1, best.indices)
    return best.values.to(torch.float32) - lse[:, None], ids


def select_chunk_size(vocab: int, k: int) -> int:
    """The chunk width of lowering "chunks-triton": chunk_size's, narrowed until the k chunks' values
    fit one program of chunk_select."""
    return chunk_select.chunk_width(vocab, k, chunk_size(vocab, k))


def chunked_select(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lowering "chunks-triton": chunk_max, then the top k chunks and their top k values in one
    kernel (ops/chunk_select.py): exact, equal values ranked by lower column first."""
    chunk = select_chunk_size(logits.shape[1], k)
    maxima, lse = chunk_max.chunk_max(logits, bias, chunk)
    return chunk_select.chunk_select(logits, bias, maxima, lse, k, chunk)


def chunked(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lowering "chunks": the registered chunk_max op (its Triton kernel on CUDA), then
    select_from_chunks in torch (Inductor compiles the gathers; the two top-Ks stay torch.topk)."""
    chunk = chunk_size(logits.shape[1], k)
    maxima, lse = chunk_max.chunk_max(logits, bias, chunk)  # the registered op: one node under export
    return select_from_chunks(logits, bias, k, maxima, lse, chunk)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _load_keys(row_ptr, bias_ptr, cols, valid, HAS_BIAS: tl.constexpr):
    """A block of the row -> (x FP32, the order-preserving int32 key of x + bias)."""
    x = tl.load(row_ptr + cols, mask=valid, other=float("-inf")).to(tl.float32)
    y = x
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=valid, other=0.0)
    return x, ordered_key(y)


@triton.jit
def _collect(row_ptr, bias_ptr, buf_ptr, vocab, lo, hi, limit, m, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
             ABOVE: tl.constexpr, SUM_EXP: tl.constexpr, STAGES: tl.constexpr):
    """One pass over the row: the keys in [lo, hi] in column order up to `limit` of them, and
    (ABOVE) every key above hi, into buf as int64 sort keys (key << 32 | 2^31 - 1 - column).
    Returns the count written, the count of keys in [lo, hi], and (SUM_EXP) sum exp(x - m).
    Without ABOVE (no key lies above hi) one scan per block places the keys."""
    offs = tl.arange(0, BLOCK)
    written = tl.full([], 0, tl.int32)
    seen = tl.full([], 0, tl.int32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
        cols = start + offs
        valid = cols < vocab
        x, key = _load_keys(row_ptr, bias_ptr, cols, valid, HAS_BIAS)
        if SUM_EXP:
            lane_sum += tl.exp(x - m)
        if ABOVE:  # [lo, hi] in int64: the radix select's bounds reach past the int32 range
            inside = (valid & (key.to(tl.int64) >= lo) & (key.to(tl.int64) <= hi)).to(tl.int32)
        else:  # the range is [lo, max key]
            inside = (valid & (key >= lo)).to(tl.int32)
        rank = seen + tl.cumsum(inside, axis=0)  # 1-based among the range's keys, in column order
        if ABOVE:
            take = ((valid & (key.to(tl.int64) > hi)) | ((rank <= limit) & (inside != 0))).to(tl.int32)
            slot = written + tl.cumsum(take, axis=0) - 1
            written += tl.sum(take, axis=0)
        else:
            take = (rank <= limit) & (inside != 0)
            slot = rank - 1
        tl.store(buf_ptr + slot, (key.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64), mask=take != 0)
        seen += tl.sum(inside, axis=0)
    if not ABOVE:
        written = tl.minimum(seen, limit)
    return written, seen, tl.sum(lane_sum, axis=0)


@triton.jit
def _vocab_topk_kernel(logits_ptr, bias_ptr, buf_ptr, logp_ptr, ids_ptr, vocab, stride_row, k,
                       BLOCK: tl.constexpr, KP: tl.constexpr, CAP: tl.constexpr, BINS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    buf_ptr += row * CAP
    offs = tl.arange(0, BLOCK)

    # Pass 1: per-lane maxima (lane = column mod BLOCK) of the logits (log-sum-exp) and of the keys.
    lane_x = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_key = tl.full([BLOCK], -2147483648, tl.int32)
    for start in tl.range(0, vocab, BLOCK, num_stages=STAGES):
        cols = start + offs
        valid = cols < vocab
        x, key = _load_keys(row_ptr, bias_ptr, cols, valid, HAS_BIAS)
        lane_x = tl.maximum(lane_x, x)
        lane_key = tl.maximum(lane_key, tl.where(valid, key, -2147483648))
    m = tl.max(lane_x, axis=0)
    # K lanes hold a key >= their K-th largest maximum t0, so the row's K-th largest key is >= t0.
    if KP <= BLOCK:
        top = tl.topk(lane_key, KP)
        t0 = tl.sum(tl.where(tl.arange(0, KP) == k - 1, top, 0), axis=0)
    else:
        t0 = tl.full([], -2147483648, tl.int32)

    # Pass 2: the keys >= t0 (about K for values spread over the lanes) and sum exp(x - m).
    written, seen, total = _collect(row_ptr, bias_ptr, buf_ptr, vocab, t0, None, CAP, m, BLOCK, HAS_BIAS,
                                    False, True, STAGES)
    if seen > CAP:  # more than CAP keys in [t0, max key]: narrow the range by radix select
        tl.debug_barrier()  # pass 2's writes land before the collect below rewrites the buffer
        lo, hi = t0.to(tl.int64), tl.max(lane_key, axis=0).to(tl.int64)
        gt = tl.full([], 0, tl.int32)  # keys above the range
        n = seen  # keys in it
        while (gt + n > CAP) & (hi > lo):  # too many to sort, and more than one distinct key
            shift = tl.full([], 0, tl.int64)
            while ((hi - lo) >> shift) >= BINS:
                shift += 1
            hist = tl.zeros([BINS], dtype=tl.int32)
            for start in range(0, vocab, BLOCK):
                cols = start + offs
                valid = cols < vocab
                _, key = _load_keys(row_ptr, bias_ptr, cols, valid, HAS_BIAS)
                key = key.to(tl.int64)
                inside = valid & (key >= lo) & (key <= hi)
                hist += masked_histogram(((key - lo) >> shift).to(tl.int32), inside, BINS)
            b, above, n = pick_bin(hist, k - gt, BINS)
            gt += above
            lo += b.to(tl.int64) << shift
            hi = tl.minimum(hi, lo + (tl.full([], 1, tl.int64) << shift) - 1)
        written, seen, _ = _collect(row_ptr, bias_ptr, buf_ptr, vocab, lo, hi, tl.minimum(n, CAP - gt), m, BLOCK,
                                    HAS_BIAS, True, False, STAGES)
    tl.debug_barrier()  # the buffer's writes visible to every thread of the program

    # Sort the survivors; the first K are the answer.
    slots = tl.arange(0, CAP)
    keys = tl.load(buf_ptr + slots, mask=slots < written, other=-9223372036854775807)
    keys = tl.sort(keys, descending=True)
    cols = (0x7FFFFFFF - (keys & 0xFFFFFFFF)).to(tl.int32)
    ordered = (keys >> 32).to(tl.int32)
    y = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    logp = (y - m) - tl.log(total)
    keep = slots < k
    tl.store(logp_ptr + row * k + slots, logp, mask=keep)
    tl.store(ids_ptr + row * k + slots, cols.to(tl.int64), mask=keep)


# ---------------------------------------------------------------------------------------------
# Launcher

DEFAULT_BLOCK, DEFAULT_WARPS, DEFAULT_STAGES = 4096, 16, 3


def _check(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> None:
    chunk_max.check_logits("vocab_topk", logits, bias)
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"vocab_topk: k must be in 1..V={logits.shape[1]}; got {k}")


def default_cap(k: int) -> int:
    """Survivors sorted per row: 2 K padded to a power of two (K slots for the threshold bin)."""
    return max(16, 2 * triton.next_power_of_2(k))


def launch(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int, block: int | None = None,
           cap: int | None = None, num_warps: int | None = None,
           stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; same signature and result as `reference` (ties aside). `block` and
    `cap` (powers of two, cap >= k) are overridable for tests (tiny rows spanning blocks; a small cap
    forces the refinement passes) and for the benchmark's sweep."""
    _check(logits, bias, k)
    rows, vocab = logits.shape
    block = block or DEFAULT_BLOCK
    cap = cap or default_cap(k)
    if cap < k or cap & (cap - 1) or block & (block - 1):
        raise ValueError(f"vocab_topk: block and cap must be powers of two, cap >= k={k}; got block {block}, "
                         f"cap {cap}")
    buf = torch.empty((rows, cap), dtype=torch.int64, device=logits.device)
    logp = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((rows, k), dtype=torch.int64, device=logits.device)
    bias_ptr = logp if bias is None else bias  # an FP32 tensor the kernel never reads without a bias
    wrap_triton(_vocab_topk_kernel)[(rows,)](
        logits, bias_ptr, buf, logp, ids, vocab, logits.stride(0), k, BLOCK=block,
        KP=max(2, triton.next_power_of_2(k)), CAP=cap, BINS=BINS, HAS_BIAS=bias is not None,
        STAGES=stages or DEFAULT_STAGES,
        num_warps=num_warps or DEFAULT_WARPS)
    return logp, ids


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::vocab_topk", mutates_args=())
def vocab_topk(logits: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(logits, bias, k)


vocab_topk.register_kernel("cpu")(reference)


@vocab_topk.register_fake
def _(logits, bias, k):
    rows = logits.shape[0]
    return logits.new_empty((rows, k), dtype=torch.float32), logits.new_empty((rows, k), dtype=torch.int64)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "torch-lse": reference_lse, "triton": vocab_topk, "chunks": chunked,
                   "chunks-triton": chunked_select}
