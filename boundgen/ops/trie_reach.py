"""A per-request allow-list as the trie's `ends` and `reach` (what ops/trie_mask.py reads), derived
on the device from the shared trie: nothing of the trie is copied, a request owns two [nodes] bool
rows.

    allow_items [K] int64 (item ids, repeats fine), the catalogue's item index (`item_index`):
    item_keys [I] int64 (its item ids, ascending), item_nodes [I] int64 (the node each ends at),
    row_ptr [M] int64 (the trie's arrays as the beam program takes them, all of one length M:
    artifact/tensors.py TRIE, text/catalogue_search.py `arrays`), depth (tokens of the longest code)
    -> ends [M] bool   an allowed item ends at the node
       reach [M] bool  an allowed item ends at or below the node
       known [K] bool  the id names an item of the catalogue (unknown ids allow nothing)
    within [M] bool (`reach_from_paths`, optional: a named subset's `ends`): only the ids whose
                    item ends there count

ends and reach come out as the program's `ends` / `reach` inputs: M long, False past the
catalogue's nodes (as catalogue_search pads them), so a request's allow-list replaces those two
arrays as they are. The same as text/catalogue.py's `Catalogue.reachable(allow_items)` (numpy,
on the host, [nodes]) padded to M, which raises on unknown ids; here the caller decides what an
unknown id means (`known`), since raising would need the device's answer on the host.

`reach_from_paths` (one request's list on its own): each item's path, its node and every
ancestor up to the root, is a row of a table built once per catalogue (`item_paths`: [I, depth + 1] int32, 4 bytes an
item a level, 20 MB for a million 4-token codes), so a request's derivation is one binary search
per id among item_keys, one gather of the K rows, and two [M + 1] bool fills marking the rows'
first column (ends) and every column (reach): about a dozen tensor ops, whatever the depth.
Unknown ids (and ids outside `within`) are sent to a spare slot M, dropped at the end, so that
every write is True (no ordering among repeats).

`fill_rows` (what a call of several requests uses): the same from the same table, for the
allow-lists of a whole call at once, written into the call's rows of reach and ends ([R, L], the
program's inputs, runtime/context.py): the listed rows cleared, then each id's path marked in its
request's row, an id not kept sent to the row's last slot L - 1 (a trie's spare node: no row, no
edge leads to it, never read). One set of about a dozen ops a call, not a request, and no [M]
arrays of a request's own to allocate, fill and copy.

`reach_from_allowed` (the reference, no table): from the K allowed leaves upwards, one level a
step: `depth` steps of parent(n) = searchsorted(row_ptr, n - 1, right) - 1 (edge n - 1 leads to
n; the root is its own parent), each marking the K cursors' nodes in `reach`; about eight ops a
level. Measured on the H200 (a 1M-item catalogue, 10k ids, 2026-12-03 at 3d057ec): 0.98 ms a
request, launches of ~40 small ops on the host, where the GPU's work is microseconds: the
reason for the table.

Both: two [M + 1] bool fills (the only part that grows with the catalogue: 22 MB at 10M
items); no host sync, static shapes (a CUDA graph or export can hold them).

`reach_from_ends`: the same `reach` from a bitmap ends [M] (e.g. a subset registered with
the catalogue), level by level from the deepest (nodes are numbered level by level, `level_ptr`,
and a level's children are contiguous by parent): a parent reaches what its children's segment
of the next level holds, a difference of a cumulative sum at row_ptr's offsets. Work: one pass
over every node (int32 sums), so per request it costs more than the walk from K leaves when K x
depth is far below the node count.

No Triton kernel: a handful of torch ops, each bandwidth- or latency-bound, none on a step's
critical path (once per request).
"""

from __future__ import annotations

from typing import Sequence

import torch


def item_index(node_item: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """node_item [M] int64 (the item ending at each node, -1 if none) -> (item_keys [I] ascending,
    item_nodes [I]): built once per catalogue (one host sync, for the item count)."""
    nodes = torch.nonzero(node_item >= 0).flatten()
    keys, order = torch.sort(node_item[nodes])
    return keys, nodes[order]


def item_paths(item_nodes: torch.Tensor, row_ptr: torch.Tensor, depth: int) -> torch.Tensor:
    """[I, depth + 1]: each item's node, then its ancestors up to the root (the root repeated past
    it, for items shorter than depth), int32 (int64 for a trie of 2^31 nodes or more): built once
    per catalogue, from `item_index`'s item_nodes."""
    path, node = [item_nodes], item_nodes
    for _ in range(depth):
        node = parent_of(node, row_ptr)
        path.append(node)
    return torch.stack(path, 1).to(torch.int32 if row_ptr.shape[0] < 2 ** 31 - 1 else torch.int64)


def parent_of(node: torch.Tensor, row_ptr: torch.Tensor) -> torch.Tensor:
    """[K] nodes -> their parents (the root, and any node outside [1, nodes), stay where they are)."""
    num_nodes = row_ptr.shape[0] - 1
    inside = (node >= 1) & (node < num_nodes)
    up = torch.searchsorted(row_ptr, (node - 1).clamp(min=0), right=True) - 1
    return torch.where(inside, up, node)


def _lookup(allow_items: torch.Tensor, item_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(at [K]: each id's row in the item index, known [K]: the id is an item there)."""
    at = torch.searchsorted(item_keys, allow_items).clamp(max=item_keys.shape[0] - 1)  # a catalogue has items
    return at, item_keys[at] == allow_items


def reach_from_allowed(allow_items: torch.Tensor, item_keys: torch.Tensor, item_nodes: torch.Tensor,
                       row_ptr: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = row_ptr.shape[0]  # M; node M - 1 has no row: no item ends there, no edge leads there
    at, known = _lookup(allow_items, item_keys)
    node = torch.where(known, item_nodes[at], length)  # [K]; unknown ids to the spare slot M
    ends = torch.zeros(length + 1, dtype=torch.bool, device=row_ptr.device).index_fill_(0, node, True)
    reach = ends.clone()
    for _ in range(depth):  # every cursor one level up (the spare slot stays where it is)
        node = parent_of(node, row_ptr)
        reach.index_fill_(0, node, True)
    return ends[:length], reach[:length], known


def reach_from_ends(ends: torch.Tensor, row_ptr: torch.Tensor, level_ptr: Sequence[int]) -> torch.Tensor:
    """ends [M] bool -> reach [M] bool (level_ptr: the catalogue's, as host integers)."""
    reach = ends.clone()
    levels = len(level_ptr) - 2  # depth
    for d in range(levels - 1, -1, -1):  # parents of depth d, children of depth d + 1
        a, b, c = (int(x) for x in level_ptr[d:d + 3])
        sums = torch.zeros(c - b + 1, dtype=torch.int32, device=ends.device)
        torch.cumsum(reach[b:c].to(torch.int32), 0, out=sums[1:])
        offsets = row_ptr[a:b + 1] - (b - 1)  # edge e leads to node e + 1; these parents' edges start at b - 1
        reach[a:b] |= sums[offsets[1:]] > sums[offsets[:-1]]
    return reach


def reach_from_paths(allow_items: torch.Tensor, item_keys: torch.Tensor, item_paths: torch.Tensor, length: int,
                     within: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reach_from_allowed's (ends, reach, known) from the path table (`item_paths`); length: M.
    `fill_rows` on one row of M + 1 entries, the spare slot M cut off."""
    path, known = lookup_paths(allow_items, item_keys, item_paths)
    kept = known if within is None else known & within[path[:, 0].long()]
    reach, ends = (torch.empty((1, length + 1), dtype=torch.bool, device=item_keys.device) for _ in range(2))
    one = torch.zeros(1, dtype=torch.int64, device=item_keys.device)
    fill_rows(reach, ends, one, one.expand(allow_items.shape[0]), path, kept)
    return ends[0, :length], reach[0, :length], known


def fill_rows(reach: torch.Tensor, ends: torch.Tensor, rows: torch.Tensor, row_of: torch.Tensor, path: torch.Tensor,
              kept: torch.Tensor) -> None:
    """reach, ends [R, L] bool, in place: rows `rows` [n] int64 cleared, then for each listed id k
    that is `kept` ([K] bool) True in row row_of[k] ([K] int64, one of `rows`) at its path (reach:
    path[k] [depth + 1], its node and ancestors, as `item_paths` gives them) and its node (ends)."""
    length = reach.shape[1]
    reach.index_fill_(0, rows, False)
    ends.index_fill_(0, rows, False)
    flat = row_of.unsqueeze(1) * length + torch.where(kept.unsqueeze(1), path.long(), length - 1)
    reach.view(-1).index_fill_(0, flat.flatten(), True)
    ends.view(-1).index_fill_(0, flat[:, 0], True)


def lookup_paths(allow_items: torch.Tensor, item_keys: torch.Tensor,
                 item_paths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [K, depth + 1]: each id's row of the path table, known [K]: the id is an item)."""
    at, known = _lookup(allow_items, item_keys)
    return item_paths[at], known


reference = reach_from_allowed  # plain torch on any device, no table: the op's semantics
IMPLEMENTATIONS = {"torch": reference}  # not a lowering: serving calls fill_rows, with its table
