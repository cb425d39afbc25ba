"""Radix selection helpers shared by the selection kernels (ops/vocab_topk.py, ops/chunk_select.py):
histograms of 8-bit digits over the values still in the running, and the bin of the k-th largest.

Keys are order-preserving integers of FP32 values (`ordered_key`: the bits of y as a signed int32,
negative values' magnitude bits flipped, -0.0 read as +0.0), so comparing keys compares values.
"""

import triton
import triton.language as tl


@triton.jit
def ordered_key(y):
    """FP32 values -> int32 keys in the same order (equal values: equal keys)."""
    y = tl.where(y == 0.0, 0.0, y)
    bits = y.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def masked_histogram(digits, inside, BINS: tl.constexpr):
    """Histogram of digits (in [0, BINS)) where `inside`; the others are counted out of bin 0."""
    hist = tl.histogram(tl.where(inside, digits, 0), BINS)
    outside = tl.sum((inside == 0).to(tl.int32), axis=0)
    return hist - tl.where(tl.arange(0, BINS) == 0, outside, 0)


@triton.jit
def pick_bin(hist, need, BINS: tl.constexpr):
    """The bin holding the need-th largest value (need >= 1), the count above it, the count in it."""
    bins = tl.arange(0, BINS)
    above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0)  # values in higher bins
    b = tl.max(tl.where(above + hist >= need, bins, -1), axis=0)
    at = bins == b
    return b, tl.sum(tl.where(at, above, 0), axis=0), tl.sum(tl.where(at, hist, 0), axis=0)


@triton.jit
def kth_largest(keys, inside, k):
    """keys: int32 (ordered_key) of a 1-D block, `inside` where they count (at least k of them).
    Returns (t, ties): t the k-th largest key, ties how many keys equal to t belong to the top k
    (>= 1; the keys above t are k - ties). Four passes of 8-bit digits, all in registers."""
    biased = keys.to(tl.int64) + 2147483648  # in [0, 2^32): digits of an unsigned order
    match = inside
    need = k
    prefix = tl.full([], 0, tl.int64)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        digits = ((biased >> shift) & 255).to(tl.int32)
        b, above, _ = pick_bin(masked_histogram(digits, match, 256), need, 256)
        need -= above
        prefix = prefix | (b.to(tl.int64) << shift)
        match = match & (digits == b)
    return (prefix - 2147483648).to(tl.int32), need


@triton.jit
def top_k_mask(keys, inside, k):
    """Where the k largest keys are among those `inside` (at least k of them); of keys equal to
    the k-th largest, the lowest-indexed ones: exactly k positions."""
    t, ties = kth_largest(keys, inside, k)
    at_t = inside & (keys == t)
    return (inside & (keys > t)) | (at_t & (tl.cumsum(at_t.to(tl.int32), axis=0) <= ties))
