"""trie_topk (lowering "torch") against the separate ops it replaces: the FP32 log-softmax of the
whole row, the trie_mask op in place, torch.topk over the vocabulary (what a constrained decode
step composes by default, programs/beam.py).

Every slot of finite log-prob must hold the same token with the same value (bit for bit: both
gather one FP32 log-softmax), in the same order; the other slots hold -inf on both, token 0 here.
The logits of a row are distinct (a permutation of steps of 1/8, exact in bf16), so the order is
defined."""

import pytest
import torch

from boundgen.ops import trie_topk
from tests.ops.test_trie_mask import STOPS, VOCAB, make_trie, pick_nodes


def distinct_logits(beams, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(VOCAB, generator=gen) for _ in range(beams)]).to(dtype) / 8 - 3


def check(logits, nodes, trie, stops, bias, k, max_degree):
    stops = torch.tensor(stops, dtype=torch.int64)
    got_logp, got_ids = trie_topk.reference(logits, nodes, *trie, stops, bias, k, max_degree)
    want = trie_topk.separate(logits, nodes, *trie, stops, bias, k, max_degree)
    assert got_logp.dtype == torch.float32 and got_ids.dtype == torch.int64
    assert got_logp.shape == got_ids.shape == (nodes.shape[0], k)
    finite = torch.isfinite(want.values)
    assert torch.equal(torch.isfinite(got_logp), finite)
    assert torch.equal(got_logp[finite], want.values[finite])
    assert torch.equal(got_ids[finite], want.indices[finite])
    assert torch.isneginf(got_logp[~finite]).all() and (got_ids[~finite] == 0).all()
    return finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [2, 6, 30])
def test_equals_the_separate_ops(dtype, k):
    """Beams at the root, off the catalogue (-1), at a leaf, in a subtree the allow-list empties,
    where an allowed item ends (a stop token among the allowed), and random nodes; k below, at and
    above the allowed counts (the slots past them -inf)."""
    cat, trie = make_trie(seed=3)
    nodes = pick_nodes(cat, trie[2], 24, seed=3)
    logits = distinct_logits(nodes.shape[0], k, dtype)
    degree = int(max(cat.degree()))
    finite = check(logits, nodes, trie, STOPS[:1], None, k, degree)
    assert finite.any(dim=1).sum() >= 3 and not finite[1].any()  # some beams allowed tokens; -1 none


def test_a_larger_degree_bound_and_padded_trie_arrays():
    """D above every node's degree (the build's bound, not the catalogue's), and the trie's arrays
    padded past its edges with junk the op must not read."""
    cat, trie = make_trie(seed=5, pad=9, junk=True)
    nodes = pick_nodes(cat, trie[2], 16, seed=5)
    logits = distinct_logits(16, 5)
    check(logits, nodes, trie, STOPS[:1], None, 8, VOCAB)


def test_the_min_new_tokens_bias_bars_the_stop_token():
    cat, trie = make_trie(seed=7)
    nodes = pick_nodes(cat, trie[2], 16, seed=7)
    logits = distinct_logits(16, 7)
    bias = torch.zeros(VOCAB).index_fill(0, torch.tensor(STOPS), float("-inf"))
    check(logits, nodes, trie, STOPS[:1], bias, 6, int(max(cat.degree())))
    _, ids = trie_topk.reference(logits, nodes, *trie, torch.tensor(STOPS[:1]), bias, 6, int(max(cat.degree())))
    logp, _ = trie_topk.reference(logits, nodes, *trie, torch.tensor(STOPS[:1]), None, 6, int(max(cat.degree())))
    assert (ids != STOPS[0]).logical_or(torch.isneginf(logp)).all()


def test_no_stop_tokens():
    cat, trie = make_trie(seed=9, lengths=(3,))
    nodes = pick_nodes(cat, trie[2], 12, seed=9)
    logits = distinct_logits(12, 9)
    check(logits, nodes, trie, [], None, 4, int(max(cat.degree())))


def test_rows_each_request_its_allow_list():
    """reach and ends [Q, M] (a call of requests with different allow-lists): each request's beams
    select what they select under their own list alone, and the separate ops agree."""
    from tests.ops.test_trie_mask import rows_trie
    cat, stacked, rows = rows_trie()
    per_row = 4
    nodes = pick_nodes(cat, rows[0][2], per_row * len(rows), seed=6)
    logits = distinct_logits(nodes.shape[0], seed=6)
    degree, stops = max(cat.max_degree()), torch.tensor(STOPS)
    check(logits, nodes, stacked, STOPS, None, 6, degree)
    logp, ids = trie_topk.reference(logits, nodes, *stacked, stops, None, 6, degree)
    for r, alone in enumerate(rows):
        part = slice(r * per_row, (r + 1) * per_row)
        want_logp, want_ids = trie_topk.reference(logits[part], nodes[part], *alone, stops, None, 6, degree)
        assert torch.equal(logp[part], want_logp) and torch.equal(ids[part], want_ids)
