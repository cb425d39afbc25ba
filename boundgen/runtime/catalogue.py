"""A catalogue served with a constrained beam artifact: its trie on the device, per-request allow-lists.

    load_catalogue(cat_dir, artifact_dir, device[, reach_on_device]) -> ServedCatalogue (checked against the artifact)
    ServedCatalogue.trie(allow_items, subset)                       -> Trie (artifact/tensors.py) of one request
    ServedCatalogue.request_trie(allow_items, subset)               -> (Trie, AllowList | None): a served request's
    ServedCatalogue.derive_rows(reach, ends, lists)                 -> RowsCheck: a call's allow-lists into its rows

A constrained artifact takes the trie as program inputs (programs/beam.py), so the engine holds
one `ServedCatalogue` and hands its tensors to every call (runtime/local_engine.py); with CUDA
graphs a call first copies them into its request context's trie buffers, which the graphs read
(runtime/context.py: the four catalogue arrays when the context held another catalogue, reach and
ends when they changed). Replacing the catalogue is replacing that one reference: a request takes
the catalogue of the moment it is tokenized, with every tensor its call needs, and its context
copies what differs before the call, so it runs on the old or the new catalogue whole, never a
mix; the old one lives until its last request ends (contexts hold only weak references to it).
With CUDA graphs the new catalogue must fit the contexts' buffers (LocalEngine.set_catalogue).

An allow-list keeps the trie's four arrays and replaces its `reach` and `ends` for that request;
a request without one shares the catalogue's. Two ways to the same arrays ([M]: a row of the
program's [R, M]; tests/runtime/test_catalogue.py checks them equal):
- on the host (the reference, and the CPU's way): text/catalogue_search.py `allowed`, numpy,
  O(nodes) per request (every level of the trie), then copied to the device;
- on the device (`reach_on_device`, CUDA's way): ops/trie_reach.py, from the catalogue's path
  table (each item's node and its ancestors, built at load: 4 bytes an item a level): K binary
  searches, a gather and the fills. A request's list is not derived when it arrives: `request_trie`
  gives the request the catalogue's (or its subset's) trie and an `AllowList`, and the engine
  derives the lists of a whole call at once, into the call's rows of reach and ends, on the call's
  stream (`derive_rows`, ops/trie_reach.py `fill_rows`: one set of ops a call, nothing waited
  for). Which ids were found, and whether a row reaches anything, come back as a `RowsCheck`,
  read once the call is done: a request with an unknown id (or nothing left within its subset)
  gets the InvalidInput in place of its rows (the call ran it with those ids ignored). `trie`
  derives one list into rows of its own and raises at once (the host's words either way). Each
  request deriving its own [M] arrays on its thread, waiting for them, held served W2 with a list
  of its own a request to 91.0 QPS within the budget (docs/benchmarks.md). A check on the host
  first (a numpy searchsorted of the ids among a million sorted item ids: ~4.6 ms for 10,000 ids
  on a 2-core VM) cost more than the derivation.
A named subset (ALLOW_SUBSET, text/catalogue.py) costs a request nothing: its `reach` and `ends`
are derived once, when the catalogue is loaded (the same two ways, from its item ids), and held
on the device, 1 byte a trie node each (`subset_bytes`); requests naming it share those tensors,
so they share calls, and a context that holds them copies nothing. An allow-list within a subset
is derived as an allow-list is, keeping only the ids whose item is in the subset (`within`).
Ids not in the catalogue, or a list that leaves nothing to generate, are InvalidInput (400).
So is a list longer than the catalogue has items (`check_allow_count`, before any derivation, in
O(1)): a list of distinct known ids is never longer (repeats are allowed within the bound), and a
huge list (a 4 MiB body holds half a million ids) never reaches the derivation.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from boundgen.artifact.manifest import read_manifest
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import FILTERS, TRIE, Trie
from boundgen.errors import ConfigError, InvalidInput
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue, check_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ItemIndex:
    """What deriving an allow-list on the device needs (ops/trie_reach.py), built once at load."""
    item_keys: torch.Tensor  # [I] int64, the item ids ascending
    item_paths: torch.Tensor  # [I, depth + 1] int32, each item's node and its ancestors (trie_reach.item_paths)
    stream: torch.cuda.Stream | None  # the derivation's own stream (None on the CPU)


@dataclass(frozen=True)
class ServedCatalogue:
    path: str
    meta: dict  # catalogue.json's counts and sha256
    catalogue: Catalogue  # the host arrays, for allow-lists
    full: Trie  # device tensors, every item allowed
    index: ItemIndex | None = None  # set: allow-lists derived on the device; None: on the host
    subsets: dict[str, Trie] = field(default_factory=dict)  # a named subset's program inputs, derived at load

    @classmethod
    def on_device(cls, cat: Catalogue, vocab: int, device: str | torch.device, reach_on_device: bool | None = None,
                  path: str = "") -> "ServedCatalogue":
        """A checked catalogue's program inputs on `device` (load_catalogue's last step)."""
        arrays = catalogue_search.arrays(cat, vocab)
        full = Trie(*(torch.from_numpy(arrays[name]).to(device) for name in TRIE))
        device = torch.device(device)
        index = None
        if reach_on_device if reach_on_device is not None else device.type == "cuda":
            from boundgen.ops import trie_reach  # here: a server of plain artifacts never imports the op (Triton)

            item_keys, item_nodes = trie_reach.item_index(full.node_item)
            paths = trie_reach.item_paths(item_nodes, full.row_ptr, cat.depth)
            stream = torch.cuda.Stream(device) if device.type == "cuda" else None
            index = ItemIndex(item_keys, paths, stream)
        served = cls(path, cat.metadata(), cat, full, index)
        for name, ids in cat.subsets.items():  # each derived as an allow-list of its ids is, once
            served.subsets[name] = served._trie(ids, None, f"subset {name!r}")
        return served

    @property
    def items(self) -> int:
        """The catalogue's item count (counted once, at load)."""
        return self.meta["items"]

    @property
    def subset_bytes(self) -> int:
        """Device memory of the subsets' reach and ends."""
        return sum(t.reach.nbytes + t.ends.nbytes for t in self.subsets.values())

    def trie(self, allow_items: Sequence[int] | None = None, subset: str | None = None) -> Trie:
        """The program inputs of a request (allow_items None: every item; subset: a named subset,
        within which the allow-list applies), reach and ends [M], complete and checked (InvalidInput)."""
        return self._trie(allow_items, subset, "ALLOW_ITEMS")

    def request_trie(self, allow_items: Sequence[int] | None = None,
                     subset: str | None = None) -> tuple[Trie, "AllowList | None"]:
        """A served request's trie inputs and, on the device, its allow-list still to derive into its
        call's row (`derive_rows`; None: nothing to derive). What the host can refuse at once (no
        subset by that name, a list too long, not integers, empty) it refuses here; on the host
        the list is derived and checked here, into the trie's own reach and ends."""
        return self._request(allow_items, subset, "ALLOW_ITEMS")

    def _request(self, allow_items, subset: str | None, what: str) -> tuple[Trie, "AllowList | None"]:
        base = self.full if subset is None else self._subset(subset)
        if allow_items is None:
            return base, None
        check_allow_count(len(allow_items), self.items)
        ids = _item_ids(allow_items)
        if self.index is None:
            reach, ends = self._on_host(ids, subset, what)
            return base._replace(reach=reach, ends=ends), None
        if not ids.size:  # the root reaches an allowed item unless there is none
            raise InvalidInput(f"{what}: the allow-list leaves no item of the catalogue to generate")
        return base, AllowList(self, ids, subset, what)

    def _trie(self, allow_items, subset: str | None, what: str) -> Trie:
        base, allow = self._request(allow_items, subset, what)
        if allow is None:
            return base
        m = self.full.row_ptr.shape[0]  # one row of M + 1: the ids not kept mark the spare slot M, cut off
        reach, ends = (torch.empty((1, m + 1), dtype=torch.bool, device=self.full.reach.device) for _ in FILTERS)
        scope = torch.cuda.stream(self.index.stream) if self.index.stream is not None else contextlib.nullcontext()
        with scope:
            check = self.derive_rows(reach, ends, [allow])
            error = check.errors().get(0)
        if error is not None:
            raise error
        return base._replace(reach=reach[0, :m], ends=ends[0, :m])

    def _subset(self, name) -> Trie:
        try:
            return self.subsets[name]
        except (KeyError, TypeError):
            have = ", ".join(sorted(self.subsets)[:20]) or "none"
            raise InvalidInput(f"ALLOW_SUBSET: the catalogue has no subset {name!r} (its subsets: {have})") from None

    def _on_host(self, ids: np.ndarray, subset: str | None, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:  # the ids within the subset (a list alone: `allowed` checks it, once)
            ids = ids if subset is None else self.catalogue.allowed_ids(ids, subset)
        except ConfigError as exc:
            raise InvalidInput(f"{what}: {exc}") from None
        try:
            allow = catalogue_search.allowed(self.catalogue, ids)
        except ConfigError as exc:  # nothing left to generate
            raise InvalidInput(f"{what}: {exc}{_within(subset)}") from None
        reach, ends = catalogue_search.padded(self.catalogue, allow)
        device = self.full.reach.device
        return torch.from_numpy(reach).to(device), torch.from_numpy(ends).to(device)

    def derive_rows(self, reach: torch.Tensor, ends: torch.Tensor,
                    lists: Sequence["AllowList | None"]) -> "RowsCheck":
        """Derive a call's allow-lists into its rows of reach and ends ([R, L] bool, L >= M, on the
        device: the program's inputs), on the current stream, without waiting: lists[r] is request
        r's (None: its row stays as it is). Their check comes back to read after the call."""
        from boundgen.ops import trie_reach  # imported by on_device already: a dictionary lookup

        rows = [r for r, allow in enumerate(lists) if allow is not None]
        ids = [lists[r].ids for r in rows]
        counts = [len(i) for i in ids]
        host = torch.from_numpy(np.stack((np.concatenate(ids), np.repeat(rows, counts))))  # [2, K]: id, row
        device = reach.device
        # From pageable memory a CUDA copy returns once its bytes are staged: no wait for the stream.
        given = host.to(device, non_blocking=True)
        path, known = trie_reach.lookup_paths(given[0], self.index.item_keys, self.index.item_paths)
        kept = known
        offset = 0
        for r, count in zip(rows, counts):
            subset = lists[r].subset
            if subset is not None:  # only the ids whose item is in the subset count
                part = slice(offset, offset + count)
                kept = kept.clone() if kept is known else kept
                kept[part] &= self.subsets[subset].ends[path[part, 0].long()]
            offset += count
        rows_t = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        trie_reach.fill_rows(reach, ends, rows_t, given[1], path, kept)
        return RowsCheck(known, reach[rows_t, 0], [lists[r] for r in rows], rows, counts)


@dataclass(frozen=True, eq=False)  # compared by identity: its ids are an array
class AllowList:
    """A request's allow-list, to derive into its call's row (ServedCatalogue.derive_rows)."""

    catalogue: ServedCatalogue  # the one the request was given: a replacement never mixes
    ids: np.ndarray  # [K] int64, not empty
    subset: str | None  # the allow-list applies within this subset
    what: str  # the input's name, in errors


@dataclass(frozen=True, eq=False)
class RowsCheck:
    """What a call's derivation found, on the device until `errors` reads it (after the call: no wait)."""

    known: torch.Tensor  # [K] bool, every listed id, row after row: the id is an item of the catalogue
    roots: torch.Tensor  # [n] bool, each derived row: its root reaches an allowed item
    lists: list
    rows: list
    counts: list

    def errors(self) -> dict[int, InvalidInput]:
        """The InvalidInput of each row whose list has an unknown id or leaves nothing, by row."""
        known, roots = self.known.cpu().numpy(), self.roots.cpu().numpy()
        out, offset = {}, 0
        for allow, row, count, anything in zip(self.lists, self.rows, self.counts, roots):
            found = known[offset:offset + count]
            offset += count
            if not found.all():  # the host path's words (Catalogue.allowed_ids)
                unknown = np.unique(allow.ids[~found])
                out[row] = InvalidInput(f"{allow.what}: allowed items {unknown[:5].tolist()} are not in the catalogue")
            elif not anything:  # only with a subset: a list of known ids reaches the root
                out[row] = InvalidInput(f"{allow.what}: the allow-list leaves no item of the catalogue to generate"
                                        f"{_within(allow.subset)}")
        return out


def load_catalogue(cat_dir: str | Path, artifact_dir: str | Path, device: str | torch.device,
                   reach_on_device: bool | None = None) -> ServedCatalogue:
    """Read CAT_DIR and check it against a constrained beam artifact (its tokenizer, N_gen, stop
    tokens, the model's vocabulary and the children bound): a ConfigError says what differs.
    reach_on_device: derive allow-lists with tensor code on `device` (None: on CUDA, not on the CPU)."""
    manifest = read_manifest(artifact_dir)
    spec, vocab = manifest.program, manifest.model["config"]["vocab_size"]
    if not task_of(spec).constrained(spec):
        raise ConfigError(f"a catalogue ({cat_dir}) was given for a model that was not built with --constrained")
    cat = Catalogue.load(cat_dir)
    check_tokenizer(cat, artifact_dir, cat_dir)
    catalogue_search.check(cat, vocab, spec.steps, spec.stop_token_ids, spec.catalogue_max_degree)
    hint = degree_hint(cat, spec.catalogue_max_degree)
    if hint:
        log.info("catalogue %s: %s", cat_dir, hint)
    served = ServedCatalogue.on_device(cat, vocab, device, reach_on_device, str(cat_dir))
    if served.subsets:
        log.info("catalogue %s: %d named subsets, %.1f MB on %s", cat_dir, len(served.subsets),
                 served.subset_bytes / 1e6, device)
    return served


def degree_hint(cat: Catalogue, bound: int) -> str | None:
    """A word for the operator when the artifact looks up far more children a node than the
    catalogue has: each decode step's top K reads `bound` slots a beam (ops/trie_topk.py)."""
    below = max(cat.max_degree()[1:] or [0])
    suggested = max(1 << max(below, 1).bit_length(), 64)  # a power of two above the catalogue's degree
    if bound < 16 * suggested:  # a step's top K over D = 4,096 against 64: +0.11 ms at 800 beams (H200)
        return None
    return (f"its nodes below the root have at most {below} children, and the artifact looks up {bound} a step "
            f"(--catalogue-max-degree): an artifact built with --catalogue-max-degree {suggested} serves it faster "
            "(docs/serving.md)")


def check_allow_count(count: int, items: int) -> None:
    """Refuse an allow-list of `count` ids for a catalogue of `items` items when it is longer
    (module docstring): the same words wherever it is checked (a front-end process checks it
    before the list crosses to the engine process, server/deploy/linked_engine.py)."""
    if count > items:
        raise InvalidInput(f"ALLOW_ITEMS has {count:,} ids, more than the catalogue has items ({items:,}): "
                           "list each allowed item once")


def _within(subset: str | None) -> str:
    return "" if subset is None else f" within subset {subset!r}"


def _item_ids(allow_items) -> np.ndarray:
    ids = np.asarray(allow_items)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InvalidInput(f"ALLOW_ITEMS must be a list of integer item ids, got {np.asarray(allow_items).dtype} "
                           f"of shape {list(ids.shape)}")
    if ids.dtype.kind == "u" and ids.size and ids.max() > np.iinfo(np.int64).max:  # int64 would wrap them negative
        raise InvalidInput(f"ALLOW_ITEMS: allowed items {ids[ids > np.iinfo(np.int64).max][:5].tolist()} are not in "
                           "the catalogue (item ids are integers in [0, 2^63))")
    return ids.astype(np.int64)
