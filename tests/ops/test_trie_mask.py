"""trie_mask: the Triton kernel (under the interpreter on CPU, compiled on CUDA) against the torch
reference, both forms (the [B, V] bias and the in-place mask of a score row), the registered ops.

Exact equality: the outputs are 0 / -inf (the bias) or the input's own values (in place). Shapes
stay tiny (the interpreter takes tens of ms a program): small blocks give several programs a row
and several child-count loads on a small trie."""

import random

import numpy as np
import pytest
import torch

from boundgen.ops import trie_mask as op
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)

VOCAB = 47  # odd: the last block partial; tokens 0 .. 39 in codes, stops 41 and 45
STOPS = [41, 45]


def make_trie(seed=0, items=60, lengths=(1, 2, 3), tokens=40, allow_every=3, pad=0, junk=False):
    """A random catalogue (shared prefixes, short codes inside longer ones), an allow-list that
    empties some subtrees, and the trie as the op takes it: the beam program's arrays
    (catalogue_search.arrays, row_ptr and child_token of one length M, reach and ends [1, M]: one
    allow-list row), with `pad` more nodes without children;
    `junk`: the entries past the catalogue's edges hold random tokens and reach True (the op
    must not read them for an allowed token)."""
    rng = random.Random(seed)
    codes = sorted({tuple(rng.randrange(tokens) for _ in range(rng.choice(lengths))) for _ in range(items)})
    cat = Catalogue.from_sequences(range(len(codes)), [list(c) for c in codes])
    allow = catalogue_search.allowed(cat, list(range(0, len(codes), allow_every)))
    arrays = {k: torch.from_numpy(v) for k, v in catalogue_search.arrays(cat, VOCAB, allow).items()}
    trie = [arrays[name] for name in ("row_ptr", "child_token", "reach", "ends")]
    if pad:
        trie = [torch.cat((t, t[-1:].expand(pad) if i == 0 else torch.zeros(pad, dtype=t.dtype)))
                for i, t in enumerate(trie)]
    if junk:
        edges = cat.num_nodes - 1
        gen = torch.Generator().manual_seed(seed)
        trie[1][edges:] = torch.randint(0, VOCAB, (len(trie[1]) - edges,), generator=gen)
        trie[2][edges + 1:] = True
    return cat, (trie[0], trie[1], trie[2][None], trie[3][None])


def pick_nodes(cat, reach, count, seed=0):
    """`count` beams over the interesting nodes: the root, -1, a leaf (degree 0), a node whose
    subtree has no allowed item, a node where an allowed item ends, then random ones."""
    rng = random.Random(seed)
    degree = cat.degree()
    ends = (cat.node_item >= 0)
    kinds = [degree == 0, ~reach[0].numpy()[:cat.num_nodes], ends & (degree > 0)]
    special = [0, -1] + [int(np.flatnonzero(kind)[0]) for kind in kinds if kind.any()]
    rest = [rng.randrange(-1, cat.num_nodes) for _ in range(max(count - len(special), 0))]
    return torch.tensor((special + rest)[:count], dtype=torch.int64)


def on(device, *tensors):
    return [t.to(device) for t in tensors]


def assert_bias_matches(nodes, trie, stops, vocab, max_degree, **launch_args):
    args = (*on(KERNEL_DEVICE, nodes, *trie, torch.tensor(stops, dtype=torch.int64)), vocab, max_degree)
    got = op.launch(*args, **launch_args)
    want = op.reference(*args)
    assert got.dtype == torch.float32 and got.shape == (nodes.shape[0], vocab) and got.is_contiguous()
    assert torch.equal(got, want)
    return got


def assert_apply_matches(nodes, trie, stops, max_degree, dtype=torch.float32, vocab=VOCAB, strided=False,
                         **launch_args):
    args = on(KERNEL_DEVICE, nodes, *trie, torch.tensor(stops, dtype=torch.int64))
    gen = torch.Generator().manual_seed(1)
    wide = torch.randn(nodes.shape[0], vocab + (5 if strided else 0), generator=gen).to(KERNEL_DEVICE, dtype)
    scores = wide[:, 2:2 + vocab] if strided else wide
    before = wide.clone()
    want = scores.clone()
    op.apply_reference(want, *args, max_degree)
    op.apply_launch(scores, *args, max_degree, **launch_args)
    assert torch.equal(scores, want)
    if strided:  # columns outside the view untouched
        assert torch.equal(wide[:, :2], before[:, :2]) and torch.equal(wide[:, 2 + vocab:], before[:, 2 + vocab:])
    # For finite scores the in-place form is the bias added.
    bias = op.reference(*args, vocab, max_degree)
    assert torch.equal(want, (before[:, 2:2 + vocab] if strided else before) + bias.to(dtype))


@needs_kernel
@pytest.mark.parametrize("beams,block,child_block", [
    (9, 16, 4),  # three blocks a row (the last partial), the root's children over several loads
    (1, 64, 128),  # a single beam, one block past V, one load past every degree
], ids=["blocks", "single-beam"])
def test_bias_matches_reference(beams, block, child_block):
    cat, trie = make_trie()
    nodes = pick_nodes(cat, trie[2], beams)
    assert_bias_matches(nodes, trie, STOPS, VOCAB, max(cat.max_degree()), block=block, child_block=child_block)


@needs_kernel
def test_many_beams():
    cat, trie = make_trie(seed=3, items=40, lengths=(2, 4))
    nodes = pick_nodes(cat, trie[2], 41, seed=3)
    assert_bias_matches(nodes, trie, STOPS, VOCAB, max(cat.max_degree()), block=64)


@needs_kernel
@pytest.mark.parametrize("max_degree", [0, 2, 64], ids=["zero-is-one", "cuts-nodes", "past-every-degree"])
def test_degree_bound(max_degree):
    """D bounds the children that count: the first max(D, 1) of a node (as the reference)."""
    cat, trie = make_trie(seed=1)
    nodes = pick_nodes(cat, trie[2], 6, seed=1)
    assert_bias_matches(nodes, trie, STOPS, VOCAB, max_degree, block=32, child_block=8)


@needs_kernel
def test_dense_node_no_stops_and_nothing_allowed():
    """The root holding 40 children in one block (several halvings of the search), no stop
    tokens; an empty allow-list (nothing reachable: every row -inf)."""
    cat, trie = make_trie(seed=2, items=200, lengths=(1, 2))
    assert cat.max_degree()[0] == 40
    nodes = torch.tensor([0, 0, 1, -1])
    got = assert_bias_matches(nodes, trie, [], VOCAB, 40, block=64, child_block=16)
    assert (got[0] == 0).sum() == int(trie[2][0, 1:41].sum())
    nothing = (*trie[:2], torch.zeros_like(trie[2]), torch.zeros_like(trie[3]))
    assert torch.isneginf(assert_bias_matches(nodes, nothing, STOPS, VOCAB, 40, block=64)).all()


def rows_trie(seed=4, requests=3):
    """One catalogue under `requests` different allow-lists (every 2nd, 3rd, ... item): reach and
    ends [requests, M], and each row alone as [1, M]."""
    cat, trie = make_trie(seed=seed, allow_every=2)
    rows = [make_trie(seed=seed, allow_every=2 + r)[1] for r in range(requests)]
    stacked = (*trie[:2], torch.cat([t[2] for t in rows]), torch.cat([t[3] for t in rows]))
    return cat, stacked, rows


@needs_kernel
@pytest.mark.parametrize("per_row", [1, 4])
def test_rows_each_request_its_allow_list(per_row):
    """reach and ends [Q, M]: beam b reads row b // (B / Q), so that a call of requests with
    different allow-lists equals each request's beams under its own list alone, kernel and
    reference both, as bias and in place."""
    cat, stacked, rows = rows_trie()
    nodes = pick_nodes(cat, rows[0][2], per_row * len(rows), seed=5)
    degree = max(cat.max_degree())
    got = assert_bias_matches(nodes, stacked, STOPS, VOCAB, degree, block=32)
    for r, alone in enumerate(rows):
        part = slice(r * per_row, (r + 1) * per_row)
        assert torch.equal(got[part], op.reference(nodes[part], *alone, torch.tensor(STOPS), VOCAB, degree))
    assert_apply_matches(nodes, stacked, STOPS, degree, block=32)
    assert not all(torch.equal(rows[0][2], t[2]) for t in rows[1:])  # the lists differ


@needs_kernel
@pytest.mark.parametrize("dtype,strided", [(torch.float32, False), (torch.bfloat16, True)], ids=["fp32", "bf16-strided"])
def test_in_place_matches_reference(dtype, strided):
    cat, trie = make_trie()
    nodes = pick_nodes(cat, trie[2], 7, seed=5)
    assert_apply_matches(nodes, trie, STOPS, max(cat.max_degree()), dtype, strided=strided, block=16, child_block=8)


@needs_kernel
def test_catalogue_int32_tokens_and_tokens_past_the_vocabulary():
    """The catalogue's own int32 child tokens; a vocabulary smaller than the trie's tokens: the
    kernel never writes outside the row (the reference refuses such tokens)."""
    cat, trie = make_trie(seed=4)
    narrow = (trie[0], trie[1].to(torch.int32), *trie[2:])
    nodes = pick_nodes(cat, trie[2], 5, seed=4)
    assert_bias_matches(nodes, narrow, STOPS, VOCAB, max(cat.max_degree()), block=32)
    args = (*on(KERNEL_DEVICE, nodes, *trie, torch.tensor([3])), 20, max(cat.max_degree()))
    want = op.reference(*on(KERNEL_DEVICE, nodes, *trie, torch.tensor([3])), 60, max(cat.max_degree()))[:, :20]
    assert torch.equal(op.launch(*args, block=32), want)


@needs_kernel
@pytest.mark.parametrize("pad,junk", [(0, True), (37, False), (37, True)], ids=["junk", "padded", "padded-junk"])
def test_program_arrays_padded_past_the_catalogue(pad, junk):
    """The trie as the program holds it, padded to a longer M (a served catalogue's arrays, a
    compiled program's inputs), with junk past the catalogue's edges: both forms equal the
    reference, and the reference equals the catalogue's own minimal arrays."""
    cat, trie = make_trie(seed=8, pad=pad, junk=junk)
    _, plain = make_trie(seed=8)
    assert trie[0].shape[0] == plain[0].shape[0] + pad and len({t.shape[-1] for t in trie}) == 1
    nodes = torch.cat((pick_nodes(cat, plain[2], 8, seed=8), torch.tensor([cat.num_nodes - 1, 0])))
    degree = max(cat.max_degree())
    got = assert_bias_matches(nodes, trie, STOPS, VOCAB, degree, block=16, child_block=4)
    assert torch.equal(got, op.reference(nodes, *plain, torch.tensor(STOPS), VOCAB, degree))
    assert_apply_matches(nodes, trie, STOPS, degree, block=32, child_block=8)


def test_reference_against_the_catalogue():
    """The reference itself against the catalogue's own walk (allowed children, then stops)."""
    cat, trie = make_trie(seed=6)
    nodes = torch.arange(-1, cat.num_nodes)
    bias = op.reference(nodes, *trie, torch.tensor(STOPS), VOCAB, max(cat.max_degree()))
    reach, ends = trie[2][0].numpy(), trie[3][0].numpy()
    for n, row in zip(nodes.tolist(), bias):
        want = set()
        if n >= 0:
            lo = int(cat.row_ptr[n])
            want = {t for e, t in enumerate(cat.allowed(n), start=lo) if reach[e + 1]} | (set(STOPS) if ends[n] else set())
        assert set(torch.nonzero(row == 0).flatten().tolist()) == want


def test_allowed_tokens_list_what_the_mask_allows():
    cat, trie = make_trie(seed=7)
    nodes = torch.arange(-1, cat.num_nodes)
    args = (nodes, *trie, torch.tensor(STOPS), VOCAB, max(cat.max_degree()))
    tokens, bias = op.allowed_tokens(*args), op.reference(*args)
    assert tokens.shape == (len(nodes), max(cat.max_degree()) + len(STOPS))
    for row, mask in zip(tokens.tolist(), bias):
        listed = [t for t in row if t != VOCAB]
        assert len(listed) == len(set(listed)) and set(listed) == set(torch.nonzero(mask == 0).flatten().tolist())


def test_launchers_reject_bad_inputs():
    cat, trie = make_trie()
    nodes, stops = torch.tensor([0, 1]), torch.tensor(STOPS)
    with pytest.raises(ValueError, match="nodes must be a contiguous int64 vector"):
        op.launch(nodes.int(), *trie, stops, VOCAB, 4)
    with pytest.raises(ValueError, match=r"reach must be a contiguous bool \[Q, \d+\] \(row_ptr's length\)"):
        op.launch(nodes, *trie[:2], trie[2][:, :-1].contiguous(), trie[3], stops, VOCAB, 4)
    with pytest.raises(ValueError, match=r"reach must be .* \[Q, \d+\]"):  # the [M] form of before the rows
        op.launch(nodes, *trie[:2], trie[2][0], trie[3], stops, VOCAB, 4)
    with pytest.raises(ValueError, match=r"ends must be .* with Q dividing the 2 beams"):
        op.launch(nodes, *trie[:3], trie[3].expand(3, -1).contiguous(), stops, VOCAB, 4)
    with pytest.raises(ValueError, match="reach and ends must have one row count"):
        op.launch(nodes, *trie[:3], trie[3].expand(2, -1).contiguous(), stops, VOCAB, 4)
    catalogue_form = (torch.from_numpy(cat.row_ptr), torch.from_numpy(cat.child_token.astype(np.int64)),
                      trie[2][:, :cat.num_nodes], trie[3][:, :cat.num_nodes])  # [nodes + 1], [nodes - 1], [nodes]
    with pytest.raises(ValueError, match=r"child_token must be .* vector \[\d+\] \(row_ptr's length"):
        op.apply_launch(torch.zeros(2, VOCAB), nodes, *catalogue_form, stops, 4)
    with pytest.raises(ValueError, match="row_ptr must hold at least 2"):
        op.launch(nodes, *(t[:1] for t in trie), stops, VOCAB, 4)
    with pytest.raises(ValueError, match="child_token must be a contiguous int64 or int32"):
        op.launch(nodes, trie[0], trie[1].float(), *trie[2:], stops, VOCAB, 4)
    with pytest.raises(ValueError, match="vocab must be >= 1"):
        op.launch(nodes, *trie, stops, 0, 4)
    with pytest.raises(ValueError, match="powers of two"):
        op.launch(nodes, *trie, stops, VOCAB, 4, block=48)
    with pytest.raises(ValueError, match="scores has 3 rows, nodes 2 beams"):
        op.apply_launch(torch.zeros(3, VOCAB), nodes, *trie, stops, 4)
    with pytest.raises(ValueError, match="contiguous rows"):
        op.apply_launch(torch.zeros(VOCAB, 2).T, nodes, *trie, stops, 4)
    with pytest.raises(ValueError, match="FP32, bf16 or fp16"):
        op.apply_launch(torch.zeros(2, VOCAB, dtype=torch.float64), nodes, *trie, stops, 4)


def test_registered_op_runs_the_reference_on_cpu():
    cat, trie = make_trie()
    nodes, stops = pick_nodes(cat, trie[2], 6), torch.tensor(STOPS)
    scores = torch.randn(6, VOCAB)
    expected = scores + op.reference(nodes, *trie, stops, VOCAB, 8)
    torch.ops.boundgen.trie_mask(scores, nodes, *trie, stops, 8)
    assert torch.equal(scores, expected)
    assert op.IMPLEMENTATIONS == {"torch": op.apply_reference, "triton": op.trie_mask}


class _Mask(torch.nn.Module):
    def __init__(self, trie):
        super().__init__()
        for name, t in zip(("row_ptr", "child_token", "reach", "ends"), trie):
            self.register_buffer(name, t)
        self.register_buffer("stops", torch.tensor(STOPS))

    def forward(self, scores, nodes):
        masked = scores.clone()
        op.IMPLEMENTATIONS["triton"](masked, nodes, self.row_ptr, self.child_token, self.reach, self.ends,
                                     self.stops, 8)
        return masked


def test_op_survives_export_with_dynamic_beams():
    cat, trie = make_trie()
    beams = torch.export.Dim("B", min=2, max=4096)
    nodes = pick_nodes(cat, trie[2], 5)
    exported = torch.export.export(_Mask(trie), (torch.randn(5, VOCAB), nodes),
                                   dynamic_shapes=({0: beams}, {0: beams}))
    assert any("trie_mask" in str(c) for c in call_targets(exported))  # functionalised: the in-place op, wrapped
    nodes2 = pick_nodes(cat, trie[2], 9, seed=2)
    scores2 = torch.randn(9, VOCAB)
    want = scores2 + op.reference(nodes2, *trie, torch.tensor(STOPS), VOCAB, 8)
    assert torch.equal(exported.module()(scores2, nodes2), want)


_TRACE_SCRIPT = one_kernel_trace_script("""
    from boundgen.ops import trie_mask as op
    trie = (torch.tensor([0, 2, 2, 2]), torch.tensor([4, 7, 0, 0]), torch.ones(1, 4, dtype=torch.bool),
            torch.ones(1, 4, dtype=torch.bool), torch.tensor([9]))
    graph = make_fx(lambda nodes, *trie: op.launch(nodes, *trie, 151936, 2),
                    tracing_mode="symbolic")(torch.tensor([0, 1, -1, 2, 0]), *trie).graph
""")


def test_launcher_traces_with_symbolic_beams():
    """The launcher traced as Inductor does on the GPU: one kernel call, its grid an expression
    of B (one_kernel_trace_script says why and how)."""
    assert_script_prints_ok(_TRACE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen's vocabulary, a 4-token catalogue over a 32k-token code vocabulary, W2's beams.

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("beams", [1, 100, 800])
def test_gpu_qwen_vocabulary(beams):
    rng = np.random.default_rng(beams)
    codes = np.unique(rng.integers(0, 32768, size=(20_000, 4)), axis=0)
    codes[: len(codes) // 2, 3] = codes[: len(codes) // 2, 2]  # some denser nodes
    codes = np.unique(codes, axis=0)
    cat = Catalogue.from_sequences(np.arange(len(codes)), codes.tolist())
    allow = catalogue_search.allowed(cat, np.arange(0, len(codes), 7).tolist())
    arrays = catalogue_search.arrays(cat, 151936, allow)
    trie = tuple(torch.from_numpy(arrays[name]) for name in ("row_ptr", "child_token", "reach", "ends"))
    trie = (*trie[:2], trie[2][None], trie[3][None])
    nodes = torch.from_numpy(rng.integers(-1, cat.num_nodes, size=beams))
    nodes[0] = 0
    trie = on("cuda", *trie)
    nodes, stops = nodes.cuda(), torch.tensor([151643, 151645], device="cuda")
    for degree in (max(cat.max_degree()), max(cat.max_degree()[1:])):
        args = (nodes, *trie, stops, 151936, degree)
        assert torch.equal(op.launch(*args), op.reference(*args))
        scores = torch.randn(beams, 151936, device="cuda")
        want = scores.clone()
        op.apply_reference(want, *args[:-2], degree)
        op.apply_launch(scores, *args[:-2], degree)
        assert torch.equal(scores, want)


@pytest.mark.gpu
@needs_compiled_kernel
def test_gpu_registered_op_compiles_under_inductor():
    """The registered in-place op inside a graph Inductor compiles (as a constrained build lowers it
    with --lowering trie_mask=triton): its launcher, bool reach / ends included, must lower, and the
    compiled graph must bar what the reference bars."""
    cat, trie = make_trie(seed=3, pad=5)
    nodes = pick_nodes(cat, trie[2], 16).cuda()
    trie, stops = on("cuda", *trie), torch.tensor(STOPS, device="cuda")
    degree = max(cat.max_degree())

    def masked(scores, nodes, row_ptr, child_token, reach, ends, stops):
        scores = scores * 2.0  # a graph around the op, as in the beam program
        torch.ops.boundgen.trie_mask(scores, nodes, row_ptr, child_token, reach, ends, stops, degree)
        return scores

    scores = torch.randn(16, VOCAB, device="cuda")
    want = scores * 2.0
    op.apply_reference(want, nodes, *trie, stops, degree)
    got = torch.compile(masked, fullgraph=True, dynamic=True)(scores, nodes, *trie, stops)  # symbolic sizes, as export gives
    assert torch.equal(got, want)
