"""trie_reach: a per-request allow-list's ends / reach derived with tensor code, equal to the
catalogue's own numpy derivation (text/catalogue.py `reachable`), from item ids (the level walk,
and serving's path table, with and without a subset's `within`) and from a bitmap."""

import random

import numpy as np
import pytest
import torch

from boundgen.errors import ConfigError
from boundgen.ops import trie_reach as op
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue


def make_catalogue(seed, items=300, lengths=(1, 2, 3, 4), tokens=7):
    rng = random.Random(seed)
    codes = sorted({tuple(rng.randrange(tokens) for _ in range(rng.choice(lengths))) for _ in range(items)})
    ids = rng.sample(range(100_000), len(codes))
    return Catalogue.from_sequences(ids, [list(c) for c in codes]), ids


def device_trie(cat):
    """(item_keys, item_nodes, row_ptr) from the beam program's trie arrays (one length M)."""
    arrays = catalogue_search.arrays(cat, int(cat.child_token.max()) + 1)
    keys, nodes = op.item_index(torch.from_numpy(arrays["node_item"]))
    return keys, nodes, torch.from_numpy(arrays["row_ptr"])


def host(cat, allow):
    """(ends, reach) of `allow` on the host, padded to the program's M (what the op must equal)."""
    ends, reach = cat.reachable(allow)
    reach, ends = catalogue_search.padded(cat, (reach, ends))
    return ends, reach


def by_paths(cat, allow, within=None):
    """reach_from_paths over the catalogue's path table (serving's derivation)."""
    keys, nodes, row_ptr = device_trie(cat)
    paths = op.item_paths(nodes, row_ptr, cat.depth)
    assert paths.shape == (len(keys), cat.depth + 1) and paths.dtype == torch.int32
    return op.reach_from_paths(torch.as_tensor(allow, dtype=torch.int64), keys, paths, row_ptr.shape[0], within)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("share", [0.0, 0.02, 0.3, 1.0])
def test_the_path_table_equals_the_level_walk(seed, share):
    cat, ids = make_catalogue(seed)
    rng = random.Random(seed + 10)
    allow = (rng.sample(ids, int(share * len(ids))) if share < 1 else ids) + [-5, max(ids) + 1] + ids[:3]
    keys, nodes, row_ptr = device_trie(cat)
    walked = op.reach_from_allowed(torch.tensor(allow, dtype=torch.int64), keys, nodes, row_ptr, cat.depth)
    for got, want in zip(by_paths(cat, allow), walked):
        assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_fill_rows_writes_each_request_its_list(seed):
    """A call's lists into its rows ([R, L], L past M): each derived row equals the request's own
    reach_from_paths up to M, ids not kept mark only the row's last slot, rows not listed keep
    what they held."""
    cat, ids = make_catalogue(seed)
    keys, nodes, row_ptr = device_trie(cat)
    paths = op.item_paths(nodes, row_ptr, cat.depth)
    m, rng = row_ptr.shape[0], random.Random(seed)
    lists = {0: rng.sample(ids, 40) + [-5], 2: rng.sample(ids, 3), 3: [ids[0], max(ids) + 1, ids[0]]}
    reach = torch.ones(4, m + 3, dtype=torch.bool)  # junk the fill must clear
    ends = torch.ones(4, m + 3, dtype=torch.bool)
    rows = sorted(lists)
    given = torch.tensor([i for r in rows for i in lists[r]])
    row_of = torch.tensor([r for r in rows for _ in lists[r]])
    path, known = op.lookup_paths(given, keys, paths)
    kept = known.clone()
    kept[len(lists[0]):len(lists[0]) + 1] = False  # one known id left out (as a subset would)
    op.fill_rows(reach, ends, torch.tensor(rows), row_of, path, kept)
    assert known.tolist() == [i in ids for r in rows for i in lists[r]]
    for r in rows:
        allow = [i for i in lists[r] if not (r == 2 and i == lists[2][0])]
        want_ends, want_reach, _ = by_paths(cat, allow)
        assert torch.equal(reach[r, :m], want_reach) and torch.equal(ends[r, :m], want_ends)
        assert not reach[r, m:-1].any() and not ends[r, m:-1].any()
        assert bool(reach[r, -1]) == (r in (0, 2, 3))  # an unknown or left-out id: the spare slot only
    assert reach[1].all() and ends[1].all()  # not listed: untouched


@pytest.mark.parametrize("seed", [0, 1])
def test_within_keeps_the_ids_of_a_subset(seed):
    """`within` (a subset's ends): the ids outside it allow nothing, yet are still `known`."""
    cat, ids = make_catalogue(seed)
    rng = random.Random(seed + 20)
    subset, allow = rng.sample(ids, len(ids) // 4), rng.sample(ids, len(ids) // 2) + [-5]
    within = torch.from_numpy(host(cat, subset)[0])
    ends, reach, known = by_paths(cat, allow, within)
    want_ends, want_reach = host(cat, sorted(set(allow) & set(subset)))
    assert np.array_equal(ends.numpy(), want_ends) and np.array_equal(reach.numpy(), want_reach)
    assert known.tolist() == [True] * (len(allow) - 1) + [False]
    ends, reach, _ = by_paths(cat, sorted(set(ids) - set(subset))[:5], within)
    assert not ends.any() and not reach.any()


def test_the_path_table_of_a_single_item_and_of_nothing():
    cat = Catalogue.from_sequences([7], [[3, 1, 4]])
    ends, reach, known = by_paths(cat, [7, 8])
    assert known.tolist() == [True, False]
    assert ends.tolist() == [False, False, False, True, False] and reach.tolist() == [True] * 4 + [False]
    ends, reach, known = by_paths(cat, torch.zeros(0, dtype=torch.int64))
    assert known.numel() == 0 and not ends.any() and not reach.any()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("share", [0.0, 0.02, 0.3, 1.0])
def test_matches_the_catalogue(seed, share):
    cat, ids = make_catalogue(seed)
    rng = random.Random(seed + 10)
    allow = rng.sample(ids, int(share * len(ids))) if share < 1 else ids
    allow = allow + allow[: len(allow) // 3]  # repeats
    want_ends, want_reach = host(cat, allow)
    keys, nodes, row_ptr = device_trie(cat)
    ends, reach, known = op.reach_from_allowed(torch.tensor(allow, dtype=torch.int64), keys, nodes, row_ptr, cat.depth)
    assert known.all() and known.shape == (len(allow),)
    assert np.array_equal(ends.numpy(), want_ends) and np.array_equal(reach.numpy(), want_reach)
    assert np.array_equal(op.reach_from_ends(torch.from_numpy(want_ends), row_ptr, cat.level_ptr.tolist()).numpy(),
                          want_reach)


def test_unknown_ids_allow_nothing_and_are_reported():
    cat, ids = make_catalogue(3, items=40)
    with pytest.raises(ConfigError, match="not in the catalogue"):
        cat.reachable([ids[0], -5])
    allow = torch.tensor([ids[0], -5, max(ids) + 1, min(ids) - 1, ids[1]])
    ends, reach, known = op.reach_from_allowed(allow, *device_trie(cat), cat.depth)
    assert known.tolist() == [True, False, False, False, True]
    want_ends, want_reach = host(cat, [ids[0], ids[1]])
    assert np.array_equal(ends.numpy(), want_ends) and np.array_equal(reach.numpy(), want_reach)


def test_empty_allow_list_reaches_nothing():
    cat, _ = make_catalogue(4, items=30)
    keys, nodes, row_ptr = device_trie(cat)
    ends, reach, known = op.reach_from_allowed(torch.zeros(0, dtype=torch.int64), keys, nodes, row_ptr, cat.depth)
    assert known.numel() == 0 and not ends.any() and not reach.any() and ends.shape == row_ptr.shape
    assert not op.reach_from_ends(ends, row_ptr, cat.level_ptr.tolist()).any()


def test_single_item_catalogue():
    """Four nodes, M = 5: the padded node is neither an end nor reached, whatever the ids (an
    unknown id's spare slot is M, past the arrays)."""
    cat = Catalogue.from_sequences([7], [[3, 1, 4]])
    ends, reach, known = op.reach_from_allowed(torch.tensor([7, 8]), *device_trie(cat), cat.depth)
    assert known.tolist() == [True, False]
    assert ends.tolist() == [False, False, False, True, False] and reach.tolist() == [True] * 4 + [False]


def test_item_index_sorts_items():
    cat, ids = make_catalogue(5, items=50)
    keys, nodes, _ = device_trie(cat)
    assert keys.tolist() == sorted(ids)
    assert [cat.node_item[n] for n in nodes.tolist()] == keys.tolist()


def test_exports_without_host_sync():
    """Static shapes and no data-dependent branch: export holds it with a dynamic K."""
    cat, ids = make_catalogue(6, items=60)
    keys, nodes, row_ptr = device_trie(cat)

    class Reach(torch.nn.Module):
        def forward(self, allow):
            return op.reach_from_allowed(allow, keys, nodes, row_ptr, cat.depth)

    exported = torch.export.export(Reach(), (torch.tensor(ids[:5]),),
                                   dynamic_shapes=({0: torch.export.Dim("K", min=2, max=100_000)},))
    ends, reach, _ = exported.module()(torch.tensor(ids[3:20]))
    want_ends, want_reach = host(cat, ids[3:20])
    assert np.array_equal(ends.numpy(), want_ends) and np.array_equal(reach.numpy(), want_reach)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_large_catalogue():
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(0, 2000, size=(200_000, 4)), axis=0)
    cat = Catalogue.from_sequences(np.arange(len(codes)), codes.tolist())
    allow = rng.choice(len(codes), size=10_000, replace=False)
    keys, nodes, row_ptr = (t.cuda() for t in device_trie(cat))
    ends, reach, known = op.reach_from_allowed(torch.from_numpy(allow).cuda(), keys, nodes, row_ptr, cat.depth)
    want_ends, want_reach = host(cat, allow.tolist())
    assert known.all()
    assert np.array_equal(ends.cpu().numpy(), want_ends) and np.array_equal(reach.cpu().numpy(), want_reach)
    paths = op.item_paths(nodes, row_ptr, cat.depth)
    for got, want in zip(op.reach_from_paths(torch.from_numpy(allow).cuda(), keys, paths, row_ptr.shape[0]),
                         (ends, reach, known)):
        assert torch.equal(got, want)
    assert np.array_equal(op.reach_from_ends(ends, row_ptr, cat.level_ptr.tolist()).cpu().numpy(), want_reach)
