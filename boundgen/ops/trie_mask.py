"""The tokens each beam may generate next under a catalogue, as an additive mask over the vocabulary.

    nodes [B] int64 (each beam's trie node; -1: a beam off the catalogue), the trie in CSR form
    as the beam program takes it (artifact/tensors.py TRIE, text/catalogue_search.py `arrays`),
    arrays of one length M: row_ptr [M] int64 (the row offsets of M - 1 nodes), child_token [M]
    int64 or int32 (edge e leads to node e + 1), and the allow-lists' rows reach [Q, M] bool (an
    allowed item lies at or below the node) and ends [Q, M] bool (an allowed item ends at the
    node), Q dividing B; stop_token_ids [S] int64 (the tokens that may end an item), vocab V,
    max_degree D (at least the children of any node given)
    -> bias [B, V] FP32: 0 on the allowed tokens, -inf elsewhere.

Rows: beam b reads row b // (B / Q) of reach and ends (`filter_rows`). A beam program passes one
row per request (its W beams a request, its prompts one a request at the root), so that requests
with different allow-lists share a call; Q = 1 is one allow-list for every beam.

One length M for the arrays (one dynamic dim of a compiled program): a catalogue of `nodes` nodes
has M = nodes + 1 or more, padded (catalogue_search) with nodes that have no children and edges
that no node owns. Its edges (nodes - 1 <= M - 2) are all the op reads of child_token, and
reach at edge + 1 <= M - 1; the entries past them are never read for an allowed token, node
M - 1 has no row and no edge leads to it.

Allowed after node n: each child token whose child node is `reach`able, and the stop tokens when
an allowed item ends at n (the beam then ends as HF ends a beam on a stop token). A beam at -1,
or at a node whose subtree holds no allowed item, is allowed nothing: its candidates score -inf.
Only the first max(D, 1) children of a node count (D bounds the degree; a larger node is cut).

Two forms of one op:
    reference / launch                   -> bias [B, V] FP32, to add to the log-probs (the semantics)
    apply_reference / apply_launch       scores [B, V] (FP32, bf16 or fp16), in place: -inf on the
                                         tokens the bias has -inf, the allowed ones untouched
The in-place form needs no [B, V] mask: for finite scores, apply(scores) equals scores + bias.
It is the registered op, `trie_mask` (below), and what the beam program lowers (OpLowering's
`trie_mask`: "torch" apply_reference, "triton" the op).

Reference: gather-based and vectorised over beams (the CSR lookup of STATIC, Su et al. 2025):
each beam's children are the D slots row_ptr[n] + 0 .. D - 1, those past its degree sent to a
spare column V (`allowed_tokens`: the list [B, D + S]); one scatter of zeros into a [B, V + 1]
row of -inf writes the mask, and the spare column is dropped. D is a bound the caller fixes per call (the root's degree for the
prompt's step, the largest below it for the decode steps), so shapes stay static under export.

Triton kernel: a grid of (beams, vocabulary blocks of BLOCK columns). Each output element is
written once, by one store, so no ordering between programs or threads is needed: a program
finds the edges of its node whose tokens fall in its block (children are sorted by token:
first = row_ptr[n] + #children with token < block start, last likewise for the block's end;
counted CHILD_BLOCK children a vector load at a time, one load for a decode step's few
children), then per column a lower-bound search among those k = last - first edges
(floor(log2 k) + 1 halvings; none in the usual block that holds no child), and tests the stop
tokens against `ends[n]`. Columns allowed: bias 0 (else -inf); in place: -inf stored where not
allowed, nothing stored (and nothing read) where allowed.

Bytes a call: the fill, B x V x 4 (bias) or B x V x element size (in place, minus the allowed
columns), dominates; besides it each program reads its node's (at most D) child tokens once, to
count, and a few of them again in the search: a decode step's tens of children, from L2. At
V = 151,936: 0.61 MB a beam for the FP32 bias (61 MB at B = 100), the same again for the
caller's add that reads it; in place on FP32 log-probs, one 0.61 MB write a beam. At B = 800
that write alone is 486 MB, ~0.12 ms at 4 TB/s: a per-step budget of a few tens of us holds
only for a selection that never writes [B, V] (the top K over the allowed tokens' gathered
log-probs, [B, D + S]). BLOCK 2048 with 4 warps: 16 columns a thread, 75 programs a beam
(enough to fill the GPU at B = 100); the search's two int32 offsets a column stay in registers
(88 registers, no spill, for sm_90: tests/ops/test_sm90_compile.py).

Tokens outside [0, V) are never allowed by the kernel (the reference's scatter refuses them; the
constraint checks its tokens at construction), and nodes outside [-1, M - 1) count as -1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


def filter_rows(beams: int, rows: int, device) -> torch.Tensor:
    """[beams] int64: the row of reach and ends [rows, M] each beam reads (rows divides beams:
    consecutive beams share a row, as a request's beams do)."""
    return torch.arange(beams, device=device) // (beams // rows)


def allowed_tokens(nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor, reach: torch.Tensor,
                   ends: torch.Tensor, stop_token_ids: torch.Tensor, vocab: int, max_degree: int) -> torch.Tensor:
    """[B, max(D, 1) + S] int64: each beam's allowed tokens (its reachable children in token order,
    then the stop tokens where an allowed item ends), `vocab` in the other slots. What the mask
    marks, as a list: a selection may gather the log-probs at these columns ([B, D + S] values)
    instead of masking [B, V] (a stop token is never a child: the constraint checks it)."""
    beams = nodes.shape[0]
    alive = nodes >= 0
    node = nodes.clamp(min=0)
    row = filter_rows(beams, reach.shape[0], nodes.device)  # [B]
    start = row_ptr[node]  # [B]
    degree = torch.where(alive, row_ptr[node + 1] - start, torch.zeros_like(start))
    slot = torch.arange(max(max_degree, 1), device=nodes.device)  # [D]
    edge = (start[:, None] + slot[None, :]).clamp(max=row_ptr.shape[0] - 2)  # [B, D]; past the degree: masked
    valid = (slot[None, :] < degree[:, None]) & reach[row[:, None], edge + 1]
    spare = torch.full_like(edge, vocab)
    cols = torch.where(valid, child_token[edge], spare)
    if stop_token_ids.numel():
        stops = stop_token_ids[None, :].expand(beams, -1)
        ending = alive & ends[row, node]
        cols = torch.cat((cols, torch.where(ending[:, None], stops, torch.full_like(stops, vocab))), 1)
    return cols


def reference(nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor, reach: torch.Tensor,
              ends: torch.Tensor, stop_token_ids: torch.Tensor, vocab: int, max_degree: int) -> torch.Tensor:
    cols = allowed_tokens(nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab, max_degree)
    bias = torch.full((nodes.shape[0], vocab + 1), float("-inf"), dtype=torch.float32, device=nodes.device)
    bias = bias.scatter(1, cols, torch.zeros_like(cols, dtype=torch.float32))
    return bias[:, :vocab]


def apply_reference(scores: torch.Tensor, nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor,
                    reach: torch.Tensor, ends: torch.Tensor, stop_token_ids: torch.Tensor, max_degree: int) -> None:
    """scores [B, V] in place: -inf on the tokens `reference` bars, the others untouched."""
    barred = reference(nodes, row_ptr, child_token, reach, ends, stop_token_ids, scores.shape[1], max_degree) != 0
    scores.masked_fill_(barred, float("-inf"))


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _trie_mask_kernel(nodes_ptr, row_ptr_ptr, child_token_ptr, reach_ptr, ends_ptr, stop_ptr, out_ptr,
                      num_nodes, vocab, stride_row, max_degree, num_stops, beams_per_row, stride_filter,
                      BLOCK: tl.constexpr, CHILD_BLOCK: tl.constexpr, IN_PLACE: tl.constexpr):
    beam = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1) * BLOCK
    filter_row = (beam // beams_per_row) * stride_filter  # this beam's row of reach and ends
    reach_ptr += filter_row
    ends_ptr += filter_row
    cols = lo + tl.arange(0, BLOCK)  # [BLOCK]
    node = tl.load(nodes_ptr + beam)
    alive = (node >= 0) & (node < num_nodes)
    safe = tl.where(alive, node, 0)
    start = tl.load(row_ptr_ptr + safe)
    degree = tl.where(alive, tl.minimum(tl.load(row_ptr_ptr + safe + 1) - start, max_degree), 0)
    # The node's edges with tokens in [lo, lo + BLOCK): first .. last - 1 (tokens ascend in a node).
    before = tl.zeros([], dtype=tl.int32)
    inside = tl.zeros([], dtype=tl.int32)
    for base in range(0, degree, CHILD_BLOCK):
        slot = base + tl.arange(0, CHILD_BLOCK)
        token = tl.load(child_token_ptr + start + slot, mask=slot < degree, other=0).to(tl.int64)
        real = slot < degree
        before += tl.sum((real & (token < lo)).to(tl.int32), axis=0)
        inside += tl.sum((real & (token >= lo) & (token < lo + BLOCK)).to(tl.int32), axis=0)
    first = start + before
    # Per column, the lower bound of its token among those `inside` edges, offsets from `first`.
    low = tl.zeros([BLOCK], dtype=tl.int32)
    high = tl.zeros([BLOCK], dtype=tl.int32) + inside
    span = inside
    while span > 0:
        mid = (low + high) // 2
        open_ = low < high
        token = tl.load(child_token_ptr + first + mid, mask=open_, other=0).to(tl.int64)
        right = open_ & (token < cols)
        low = tl.where(right, mid + 1, low)
        high = tl.where(open_ & ~right, mid, high)
        span = span // 2
    hit = low < inside
    token = tl.load(child_token_ptr + first + low, mask=hit, other=-1).to(tl.int64)
    hit = hit & (token == cols)
    allowed = hit & (tl.load(reach_ptr + first + low + 1, mask=hit, other=0) != 0)
    ends_here = alive & (tl.load(ends_ptr + safe) != 0)
    for s in range(num_stops):
        allowed = allowed | (ends_here & (cols == tl.load(stop_ptr + s)))
    in_row = cols < vocab
    if IN_PLACE:
        barred = tl.full([BLOCK], float("-inf"), tl.float32).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + beam * stride_row + cols, barred, mask=in_row & ~allowed)
    else:
        tl.store(out_ptr + beam * stride_row + cols, tl.where(allowed, 0.0, float("-inf")), mask=in_row)


# ---------------------------------------------------------------------------------------------
# Launchers

SCORE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEFAULT_BLOCK, DEFAULT_CHILD_BLOCK, DEFAULT_WARPS = 2048, 128, 4


def _check(op: str, nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab: int, max_degree: int) -> None:
    def vector(name, t, dtypes, length=None):
        if t.dim() != 1 or t.dtype not in dtypes or (length is not None and t.shape[0] != length) or (
                t.numel() and t.stride(0) != 1):
            want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            size = f"[{length}] (row_ptr's length: the trie's arrays have one length)" if length is not None else "[n]"
            raise ValueError(f"{op}: {name} must be a contiguous {want} vector {size}; got {t.dtype} "
                             f"{tuple(t.shape)}, strides {t.stride()}")
    vector("nodes", nodes, (torch.int64,))
    vector("row_ptr", row_ptr, (torch.int64,))
    length = row_ptr.shape[0]  # M: the trie's four arrays have one length (module docstring)
    if length < 2:
        raise ValueError(f"{op}: row_ptr must hold at least 2 row offsets (a root and its end); got {length}")
    vector("child_token", child_token, (torch.int64, torch.int32), length)
    for name, t in (("reach", reach), ("ends", ends)):
        if (t.dim() != 2 or t.dtype != torch.bool or t.shape[1] != length or t.shape[0] < 1
                or nodes.shape[0] % t.shape[0] or (t.numel() and t.stride() != (length, 1))):
            raise ValueError(f"{op}: {name} must be a contiguous bool [Q, {length}] (row_ptr's length) with Q "
                             f"dividing the {nodes.shape[0]} beams; got {t.dtype} {tuple(t.shape)}, strides {t.stride()}")
    if reach.shape[0] != ends.shape[0]:
        raise ValueError(f"{op}: reach and ends must have one row count; got {reach.shape[0]} and {ends.shape[0]}")
    vector("stop_token_ids", stop_token_ids, (torch.int64,))
    devices = {t.device for t in (nodes, row_ptr, child_token, reach, ends, stop_token_ids)}
    if len(devices) != 1:
        raise ValueError(f"{op}: every tensor must be on one device; got {sorted(map(str, devices))}")
    if vocab < 1 or max_degree < 0:
        raise ValueError(f"{op}: vocab must be >= 1 and max_degree >= 0; got {vocab}, {max_degree}")


def _launch(out, nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab, max_degree, in_place,
            block, child_block, num_warps) -> None:
    block, child_block = block or DEFAULT_BLOCK, child_block or DEFAULT_CHILD_BLOCK
    if block & (block - 1) or child_block & (child_block - 1):
        raise ValueError(f"trie_mask: block and child_block must be powers of two; got {block}, {child_block}")
    if nodes.shape[0] == 0:
        return
    stops = stop_token_ids if stop_token_ids.numel() else nodes  # no stop: an int64 tensor the kernel never reads
    wrap_triton(_trie_mask_kernel)[(nodes.shape[0], triton.cdiv(vocab, block))](
        nodes, row_ptr, child_token, reach, ends, stops, out,  # bool vectors: *i1 pointers (a dtype view here
        # is an aten.view.dtype that Inductor of torch 2.11 cannot lower for bool)
        row_ptr.shape[0] - 1, vocab, out.stride(0), max(max_degree, 1), stop_token_ids.shape[0],
        nodes.shape[0] // reach.shape[0], reach.stride(0),  # beams a row of reach / ends, its stride
        BLOCK=block, CHILD_BLOCK=child_block, IN_PLACE=in_place, num_warps=num_warps or DEFAULT_WARPS)


def launch(nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor, reach: torch.Tensor,
           ends: torch.Tensor, stop_token_ids: torch.Tensor, vocab: int, max_degree: int, block: int | None = None,
           child_block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. `block` (columns a
    program writes) and `child_block` (children counted a load) are overridable for tests (many
    programs and several count loads on tiny inputs) and the benchmark."""
    _check("trie_mask", nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab, max_degree)
    bias = torch.empty((nodes.shape[0], vocab), dtype=torch.float32, device=nodes.device)
    _launch(bias, nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab, max_degree, False,
            block, child_block, num_warps)
    return bias


def apply_launch(scores: torch.Tensor, nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor,
                 reach: torch.Tensor, ends: torch.Tensor, stop_token_ids: torch.Tensor, max_degree: int,
                 block: int | None = None, child_block: int | None = None, num_warps: int | None = None) -> None:
    """Run the Triton kernel in place on scores [B, V] (rows of any stride); as `apply_reference`."""
    if scores.dim() != 2 or scores.dtype not in SCORE_DTYPES or (scores.numel() and scores.stride(1) != 1):
        raise ValueError(f"trie_mask in place: scores must be [B, V] FP32, bf16 or fp16 with contiguous rows; got "
                         f"{scores.dtype} {tuple(scores.shape)}, strides {scores.stride()}")
    if scores.shape[0] != nodes.shape[0]:
        raise ValueError(f"trie_mask in place: scores has {scores.shape[0]} rows, nodes {nodes.shape[0]} beams")
    _check("trie_mask in place", nodes, row_ptr, child_token, reach, ends, stop_token_ids, scores.shape[1],
           max_degree)
    if scores.device != nodes.device:
        raise ValueError(f"trie_mask in place: scores on {scores.device}, the trie on {nodes.device}")
    _launch(scores, nodes, row_ptr, child_token, reach, ends, stop_token_ids, scores.shape[1], max_degree, True,
            block, child_block, num_warps)


# ---------------------------------------------------------------------------------------------
# The registered op: the in-place form, the one the beam program lowers (a [B, V] bias would be
# one more [B, V] write and read a step). One node under torch.export; the kernel on CUDA, the
# reference on CPU. Named after this module, as a package calls it by name (ops/custom.py).

@triton_op("boundgen::trie_mask", mutates_args={"scores"})
def trie_mask(scores: torch.Tensor, nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor,
              reach: torch.Tensor, ends: torch.Tensor, stop_token_ids: torch.Tensor, max_degree: int) -> None:
    apply_launch(scores, nodes, row_ptr, child_token, reach, ends, stop_token_ids, max_degree)


trie_mask.register_kernel("cpu")(apply_reference)


@trie_mask.register_fake
def _(scores, nodes, row_ptr, child_token, reach, ends, stop_token_ids, max_degree):
    return None


# Lowerings by name (`OpLowering.trie_mask`): the in-place form, `apply_reference`'s signature.
IMPLEMENTATIONS = {"torch": apply_reference, "triton": trie_mask}
