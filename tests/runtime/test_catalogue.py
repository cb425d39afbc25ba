"""A served catalogue's allow-lists: derived on the device (ops/trie_reach.py, CUDA's way) they
equal the host's numpy derivation (the reference, the CPU's way), array for array, and both refuse
the same bad lists with the same words. On the CPU the device path runs on CPU tensors. Last,
CUDA graphs for a constrained artifact, and what its requests bring to a context's trie buffers."""

import random

import numpy as np
import pytest
import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec
from boundgen.errors import InvalidInput
from boundgen.runtime.catalogue import ServedCatalogue, degree_hint
from boundgen.runtime.local_engine import settings_in_effect
from boundgen.text.catalogue import Catalogue

VOCAB = 64


def served_pair(seed, items=200, lengths=(1, 2, 3, 4), device="cpu"):
    """(catalogue, its item ids, host-path ServedCatalogue, device-path ServedCatalogue)."""
    rng = random.Random(seed)
    codes = sorted({tuple(rng.randrange(9) for _ in range(rng.choice(lengths))) for _ in range(items)})
    ids = rng.sample(range(1_000_000), len(codes))
    cat = Catalogue.from_sequences(ids, [list(c) for c in codes])
    host = ServedCatalogue.on_device(cat, VOCAB, device, reach_on_device=False)
    dev = ServedCatalogue.on_device(cat, VOCAB, device, reach_on_device=True)
    assert host.index is None and dev.index is not None
    return cat, ids, host, dev


def assert_same_trie(got, want):
    for name, g, w in zip(got._fields, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, name
        assert torch.equal(g, w), name


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("share", [0.01, 0.2, 1.0])
def test_device_path_equals_host_path(seed, share):
    cat, ids, host, dev = served_pair(seed)
    rng = random.Random(seed + 5)
    allow = rng.sample(ids, max(1, int(share * len(ids))))
    allow = (allow + allow[: len(allow) // 2])[: len(ids)]  # repeats, within the bound (the item count)
    got, want = dev.trie(allow), host.trie(allow)
    assert_same_trie(got, want)
    assert got.reach.shape == got.row_ptr.shape  # the program's one length M
    assert not torch.equal(want.reach, host.full.reach) or share == 1.0  # an allow-list that restricts something
    assert dev.trie(None) is dev.full and host.trie(None) is host.full


def test_single_item_and_a_padded_catalogue():
    """Four nodes padded to M = 5 and one item: the padded node is neither reached nor an end."""
    cat = Catalogue.from_sequences([7], [[3, 1, 4]])
    host = ServedCatalogue.on_device(cat, VOCAB, "cpu", reach_on_device=False)
    dev = ServedCatalogue.on_device(cat, VOCAB, "cpu", reach_on_device=True)
    assert_same_trie(dev.trie([7]), host.trie([7]))
    assert dev.trie([7]).reach.tolist() == [True] * 4 + [False]


@pytest.mark.parametrize("make_allow, words", [
    (lambda ids: [ids[0], 10**9, -3, ids[1]], r"allowed items \[-3, 1000000000\] are not in the catalogue"),
    (lambda ids: [], "leaves no item of the catalogue to generate"),
    (lambda ids: [[ids[0], ids[1]]], "must be a list of integer item ids"),
], ids=["unknown-ids", "empty", "not-a-list"])
def test_bad_allow_lists_are_refused_alike(make_allow, words):
    cat, ids, host, dev = served_pair(3, items=30)
    allow = make_allow(ids)
    for served in (host, dev):
        with pytest.raises(InvalidInput, match=words):
            served.trie(allow)


def test_an_allow_list_longer_than_the_catalogue_is_refused_before_any_derivation(monkeypatch):
    """More ids than items (repeats, or unknown ids): refused on its length, in O(1), before the
    ids are even read; as long as the catalogue (repeats included) it is served."""
    cat, ids, host, dev = served_pair(4, items=30)
    allow = ids + ids[:1]
    for served in (host, dev):
        monkeypatch.setattr("boundgen.runtime.catalogue._item_ids", lambda _: pytest.fail("the ids were read"))
        with pytest.raises(InvalidInput, match=rf"ALLOW_ITEMS has {len(allow)} ids, more than the catalogue has "
                                               rf"items \({len(ids)}\): list each allowed item once"):
            served.trie(allow)
        monkeypatch.undo()
        assert_same_trie(served.trie(ids[1:] + ids[1:2]), served.trie(ids[1:]))  # a repeat within the bound


def served_with_subsets(seed, items=120):
    """served_pair's catalogue with three named subsets: (item ids, host path, device path, subsets)."""
    cat, ids, _, _ = served_pair(seed, items)
    rng = random.Random(seed + 9)
    subsets = {"a": rng.sample(ids, len(ids) // 3), "b": rng.sample(ids, 5), "one": ids[:1]}
    cat = cat.with_subsets(subsets)
    return (ids, *(ServedCatalogue.on_device(cat, VOCAB, "cpu", reach_on_device=on) for on in (False, True)),
            subsets)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_named_subset_is_its_ids_allow_list_derived_once(seed):
    """ALLOW_SUBSET: the trie inputs equal an allow-list of the subset's ids, on either path; they
    are derived at load, so every request naming it gets the same tensors (no derivation, and a
    context that holds them copies nothing); an allow-list within a subset is the list's ids that
    are in it."""
    ids, host, dev, subsets = served_with_subsets(seed)
    for served in (host, dev):
        assert set(served.subsets) == {"a", "b", "one"}
        assert served.subset_bytes == 3 * 2 * served.full.reach.numel()
        for name, members in subsets.items():
            assert_same_trie(served.trie(subset=name), host.trie(members))
            assert served.trie(subset=name) is served.trie(subset=name)
        listed = random.Random(seed).sample(ids, len(ids) // 2) + subsets["b"][:2]
        within = [i for i in listed if i in set(subsets["a"])]
        assert_same_trie(served.trie(listed, "a"), host.trie(within))
        assert_same_trie(served.trie(subsets["b"], "b"), served.trie(subset="b"))


@pytest.mark.parametrize("allow, subset, words", [
    (None, "hats", r"ALLOW_SUBSET: the catalogue has no subset 'hats' \(its subsets: a, b, one\)"),
    ([10**9], "a", r"ALLOW_ITEMS: allowed items \[1000000000\] are not in the catalogue"),
    ("outside", "one", r"ALLOW_ITEMS: the allow-list leaves no item of the catalogue to generate within subset 'one'"),
], ids=["unknown-subset", "unknown-id-in-a-subset", "nothing-within"])
def test_bad_subset_requests_are_refused_alike(allow, subset, words):
    ids, host, dev, subsets = served_with_subsets(2)
    if allow == "outside":
        allow = [i for i in ids if i not in subsets["one"]][:3]
    for served in (host, dev):
        with pytest.raises(InvalidInput, match=words):
            served.trie(allow, subset)


def test_default_derivation_follows_the_device():
    cat = Catalogue.from_sequences([1, 2], [[3], [4, 5]])
    assert ServedCatalogue.on_device(cat, VOCAB, "cpu").index is None  # the CPU: the host's numpy


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_device_path_equals_host_path():
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(0, 2000, size=(200_000, 4)), axis=0)
    subset = rng.choice(len(codes), size=50_000, replace=False)
    cat = Catalogue.from_sequences(np.arange(len(codes)), codes.tolist()).with_subsets({"half": subset})
    dev = ServedCatalogue.on_device(cat, 4096, "cuda")
    host = ServedCatalogue.on_device(cat, 4096, "cuda", reach_on_device=False)
    assert dev.index is not None and dev.index.stream is not None
    allow = rng.choice(len(codes), size=10_000, replace=False).tolist()
    assert_same_trie(dev.trie(allow), host.trie(allow))
    assert_same_trie(dev.subsets["half"], host.subsets["half"])
    assert_same_trie(dev.trie(allow, "half"), host.trie(allow, "half"))
    for served in (dev, host):  # an unknown id, found as the device derives the list: the same words
        with pytest.raises(InvalidInput, match=r"allowed items \[999999999\] are not in the catalogue"):
            served.trie(allow[:5] + [999_999_999])


# CUDA graphs: a constrained beam program replays them too (runtime/local_engine.py
# `settings_in_effect`), reading the trie from its contexts' buffers (tests/runtime/test_trie_buffers.py).

def test_graphs_follow_the_device_for_a_constrained_beam_program():
    runtime = RuntimeConfig(cuda_graphs=True)
    for spec in (BeamSpec(width=4, steps=3, stop_token_ids=(1,)),
                 BeamSpec(width=4, steps=3, stop_token_ids=(1,), constrained=True)):
        assert settings_in_effect(runtime, spec, "cuda").cuda_graphs
        assert not settings_in_effect(runtime, spec, "cpu").cuda_graphs


def test_requests_bring_their_own_reach_and_ends():
    """What a context copies for a call: an allow-list brings new reach / ends tensors to every
    request, on either path, and shares the catalogue's four arrays, which are copied only when
    the context held another catalogue (runtime/context.py)."""
    cat, ids, host, dev = served_pair(4)
    for served in (host, dev):
        first, second = served.trie(ids[:3]), served.trie(ids[:3])
        for name in ("row_ptr", "child_token", "edge_keys", "node_item"):
            assert getattr(first, name) is getattr(served.full, name) is getattr(second, name)
        assert len({t.reach.data_ptr() for t in (served.full, first, second)}) == 3
        assert len({t.ends.data_ptr() for t in (served.full, first, second)}) == 3


def test_a_far_larger_degree_bound_gets_a_hint():
    """The bound is each decode step's width (ops/trie_topk.py): a catalogue of few children a node
    under a large bound gets a word naming the flag and a size; one near the bound gets none."""
    cat = Catalogue.from_sequences(range(4), [[3, 5], [3, 6], [4, 5], [4, 7]])  # 2 children below the root
    hint = degree_hint(cat, 4096)
    assert "at most 2 children" in hint and "--catalogue-max-degree 64 " in hint
    assert degree_hint(cat, 512) is None
    wide = Catalogue.from_sequences(range(300), [[1, t] for t in range(300)])
    assert degree_hint(wide, 4096) is None and "--catalogue-max-degree 512 " in degree_hint(wide, 8192)


def test_allow_ids_past_int64_are_named_not_wrapped():
    """numpy reads 2^63 as uint64, which int64 wrapped to -2^63: the error named an id no one sent."""
    from boundgen.runtime.catalogue import _item_ids

    assert _item_ids([3, 1]).tolist() == [3, 1]
    with pytest.raises(InvalidInput, match=r"allowed items \[9223372036854775808\] are not in the catalogue"):
        _item_ids([2 ** 63])
    with pytest.raises(InvalidInput, match="must be a list of integer item ids"):
        _item_ids([10 ** 20])
