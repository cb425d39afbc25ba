"""A catalogue of items as a trie over token ids: the index constrained beam search walks.

Every item is a non-empty sequence of token ids (its code); a beam may only generate a prefix
of some item's code, and a complete code names the item. The trie is stored in CSR form, nodes
numbered level by level (root 0, then every depth-1 node, ...), children of one node contiguous
and in ascending token order:

    row_ptr     [nodes + 1] int64   node n's children are edges row_ptr[n] .. row_ptr[n+1] - 1
    child_token [nodes - 1] int32   the token of each edge, ascending within a node
    node_item   [nodes]     int64   the item whose code ends at the node, -1 if none
    level_ptr   [depth + 2] int64   the nodes of depth d are level_ptr[d] .. level_ptr[d+1] - 1

Edge e leads to node e + 1 (every node but the root has one incoming edge, and edges are
numbered in the order of the nodes they lead to), so no child array is stored.

Build (`Catalogue.from_sequences`), vectorised with numpy: the codes as an [items, depth] int64
matrix padded with -1, sorted lexicographically (np.lexsort; -1 sorts a shorter code before its
extensions); then per level d a row starts a new node where its code has a token at d and its
first d + 1 tokens differ from the row above (a running OR along the columns of "differs from
the row above"). Node ids are the running count of new nodes per level; a node's parent is the
node of the same row one level up. Measured: a million items of 5 tokens build in ~5 s on one
core with a peak of 0.37 GB (75 bytes an item-token: the matrix, its sorted copy, the per-level
masks); the index takes 20 bytes a node (row_ptr 8, child_token 4, node_item 8).

Named subsets (`subsets`, e.g. a category or "in stock"): a name -> the sorted ids of its items,
registered with the catalogue when it is built (each item's `subsets` field, text/catalogue_items.py).
A request names one instead of sending its ids (ALLOW_SUBSET); the server derives each subset's
reach once, at load (runtime/catalogue.py). Names: 1-64 of [A-Za-z0-9_.-], at most MAX_SUBSETS.

On disk (`save`, `load`): CAT_DIR/trie.npz (the four arrays, uncompressed), CAT_DIR/subsets.npz
(one int64 array a subset, only when there are any) and CAT_DIR/catalogue.json (format version,
counts, depth, the largest number of children of a node per depth, each subset's item count, the
sha256 of the arrays and subsets, and the tokenizer it was built with). No torch here.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from boundgen.errors import ConfigError

FORMAT_VERSION = 1
ARRAYS = ("row_ptr", "child_token", "node_item", "level_ptr")
INDEX_FILE, META_FILE, SUBSETS_FILE = "trie.npz", "catalogue.json", "subsets.npz"
SUBSET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_SUBSETS = 1024  # each costs the server two bytes a trie node on the device (runtime/catalogue.py)


@dataclass
class Catalogue:
    row_ptr: np.ndarray
    child_token: np.ndarray
    node_item: np.ndarray
    level_ptr: np.ndarray
    tokenizer: dict = field(default_factory=dict)  # {"vocab_size": V, "sha256": of tokenizer.json}
    subsets: dict[str, np.ndarray] = field(default_factory=dict)  # name -> its item ids, ascending, unique

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_sequences(cls, item_ids: Sequence[int] | np.ndarray, codes: Sequence[Sequence[int]],
                       tokenizer: dict | None = None, lines: Sequence[int] | np.ndarray | None = None) -> "Catalogue":
        """Item ids [items] and their non-empty codes -> the trie. Two items with one code are an
        error naming both (by `lines`, the input line of each item, where given)."""
        items = np.asarray(item_ids, dtype=np.int64)
        lengths = np.fromiter((len(c) for c in codes), dtype=np.int64, count=len(codes))
        if len(items) != len(lengths):
            raise ValueError("item_ids and codes differ in length")
        if len(items) == 0:
            raise ConfigError("the catalogue has no items")
        matrix = pad_codes(codes, lengths)
        order = lexsort_rows(matrix)
        same = np.flatnonzero((matrix[order[1:]] == matrix[order[:-1]]).all(axis=1))
        if len(same):
            a, b = sorted(order[same[0]:same[0] + 2].tolist())
            where = f"lines {lines[a]} and {lines[b]}: " if lines is not None else ""
            raise ConfigError(f"{where}items {items[a]} and {items[b]} have the same token sequence "
                              f"({len(same)} such pairs in all): a sequence must name one item")
        return cls._from_sorted(items[order], matrix[order], lengths[order], tokenizer or {})

    @classmethod
    def _from_sorted(cls, items: np.ndarray, matrix: np.ndarray, lengths: np.ndarray, tokenizer: dict):
        n, depth = matrix.shape
        differs = np.ones((n, depth), dtype=bool)  # row i's first d + 1 tokens differ from row i - 1's
        if n > 1:
            np.logical_or.accumulate(matrix[1:] != matrix[:-1], axis=1, out=differs[1:])
        level_ptr = [0, 1]
        parents, tokens = [], []
        row_node = np.zeros(n, dtype=np.int64)  # each row's node at the previous level (root first)
        for d in range(depth):
            has = lengths > d
            new = has & differs[:, d]
            rows = np.flatnonzero(new)
            first = level_ptr[-1]
            parents.append(row_node[rows])
            tokens.append(matrix[rows, d])
            # Rows with a token at d: node = the last new node at or above the row (rows are sorted).
            count = np.cumsum(new) - 1
            row_node = np.where(has, first + count, row_node)
            level_ptr.append(first + len(rows))
            if d == 0:
                end_node = np.zeros(n, dtype=np.int64)
            end_node = np.where(lengths == d + 1, row_node, end_node)
        nodes = level_ptr[-1]
        parent = np.concatenate(parents)  # of nodes 1 .. nodes - 1: non-decreasing
        row_ptr = np.zeros(nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(parent, minlength=nodes), out=row_ptr[1:])
        node_item = np.full(nodes, -1, dtype=np.int64)
        node_item[end_node] = items
        return cls(row_ptr=row_ptr, child_token=np.concatenate(tokens).astype(np.int32), node_item=node_item,
                   level_ptr=np.asarray(level_ptr, dtype=np.int64), tokenizer=dict(tokenizer))

    # -- what it holds -------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self.node_item)

    @property
    def num_items(self) -> int:
        return int((self.node_item >= 0).sum())

    @property
    def depth(self) -> int:
        """Tokens of the longest code."""
        return len(self.level_ptr) - 2

    def degree(self) -> np.ndarray:
        """[nodes] int64: children of each node."""
        return np.diff(self.row_ptr)

    def max_degree(self) -> list[int]:
        """The largest number of children of a node, per depth (0: the root)."""
        deg = self.degree()
        return [int(deg[a:b].max(initial=0)) for a, b in zip(self.level_ptr[:-1], self.level_ptr[1:])]

    def parent(self) -> np.ndarray:
        """[nodes] int64: each node's parent (-1 for the root)."""
        return np.concatenate(([-1], np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degree())))

    def content_sha256(self) -> str:
        """Of the arrays and the subsets (a catalogue without subsets hashes as before they existed)."""
        h = hashlib.sha256()
        named = [(name, getattr(self, name)) for name in ARRAYS]
        named += [(f"subset {name}", self.subsets[name]) for name in sorted(self.subsets)]
        for name, array in named:
            array = np.ascontiguousarray(array)
            h.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            h.update(array.tobytes())
        return h.hexdigest()

    def lookup(self, code: Sequence[int]) -> int:
        """The node a code leads to, -1 if it is no prefix of an item (a reference walk, for checks)."""
        node = 0
        for token in code:
            lo, hi = self.row_ptr[node], self.row_ptr[node + 1]
            at = lo + int(np.searchsorted(self.child_token[lo:hi], token))
            if at >= hi or self.child_token[at] != token:
                return -1
            node = at + 1
        return node

    def allowed(self, node: int) -> list[int]:
        """The tokens that may follow `node` (its children), ascending."""
        return self.child_token[self.row_ptr[node]:self.row_ptr[node + 1]].tolist()

    def metadata(self) -> dict:
        subsets = {"subsets": {name: len(ids) for name, ids in sorted(self.subsets.items())}} if self.subsets else {}
        return {"format": "boundgen-catalogue", "format_version": FORMAT_VERSION, "items": self.num_items,
                "nodes": self.num_nodes, "depth": self.depth, "max_degree": self.max_degree(), **subsets,
                "sha256": self.content_sha256(), "tokenizer": self.tokenizer}

    # -- named subsets -------------------------------------------------------------------------

    def with_subsets(self, subsets: dict[str, Sequence[int] | np.ndarray]) -> "Catalogue":
        """This catalogue with named subsets of its items (repeats within one are fine); a bad name,
        an empty subset or an id that is no item of the catalogue is a ConfigError."""
        if len(subsets) > MAX_SUBSETS:
            raise ConfigError(f"{len(subsets):,} subsets, more than the {MAX_SUBSETS:,} a catalogue may register")
        items = np.sort(self.node_item[self.node_item >= 0])
        checked = {}
        for name, ids in subsets.items():
            check_subset_name(name)
            ids = np.unique(np.asarray(ids, dtype=np.int64))
            if not ids.size:
                raise ConfigError(f"subset {name!r} has no items")
            at = np.searchsorted(items, ids).clip(max=len(items) - 1)
            unknown = ids[items[at] != ids]
            if unknown.size:
                raise ConfigError(f"subset {name!r}: items {unknown[:5].tolist()} are not in the catalogue")
            checked[name] = ids
        return Catalogue(self.row_ptr, self.child_token, self.node_item, self.level_ptr, dict(self.tokenizer), checked)

    def subset(self, name: str) -> np.ndarray:
        """A named subset's item ids (ascending); ConfigError naming the ones there are."""
        try:
            return self.subsets[name]
        except KeyError:
            have = ", ".join(sorted(self.subsets)[:20]) or "none"
            raise ConfigError(f"the catalogue has no subset {name!r} (its subsets: {have})") from None

    def allowed_ids(self, allow_items: Sequence[int] | None = None, subset: str | None = None) -> np.ndarray | None:
        """The item ids a request allows: its allow-list within its named subset (None and None:
        every item, None). Ids not in the catalogue are a ConfigError, inside the subset or not."""
        within = None if subset is None else self.subset(subset)
        if allow_items is None:
            return within
        ids = _item_array(allow_items)
        present = np.isin(ids, self.node_item) & (ids >= 0)  # -1 marks the nodes where no item ends
        if not present.all():
            raise ConfigError(f"allowed items {ids[~present][:5].tolist()} are not in the catalogue")
        return ids if within is None else ids[np.isin(ids, within, assume_unique=True)]

    # -- allow-lists ---------------------------------------------------------------------------

    def reachable(self, allow_items: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ends [nodes] bool: an allowed item's code ends at the node; reach [nodes] bool: an
        allowed item's code ends at or below the node). None: every item is allowed. Item ids
        not in the catalogue are an error."""
        if allow_items is None:
            return self.node_item >= 0, np.ones(self.num_nodes, dtype=bool)
        wanted = _item_array(allow_items)
        present = np.isin(wanted, self.node_item) & (wanted >= 0)  # -1 marks the nodes where no item ends
        if not present.all():
            missing = wanted[~present][:5].tolist()
            raise ConfigError(f"allowed items {missing} are not in the catalogue")
        ends = np.isin(self.node_item, wanted) & (self.node_item >= 0)
        reach = ends.copy()
        parent = self.parent()
        for d in range(self.depth, 0, -1):  # deepest level first: a node reaches what its children reach
            a, b = self.level_ptr[d], self.level_ptr[d + 1]
            np.logical_or.at(reach, parent[a:b], reach[a:b])
        return ends, reach

    # -- files ---------------------------------------------------------------------------------

    def save(self, out_dir: str | Path) -> dict:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / INDEX_FILE, **{name: getattr(self, name) for name in ARRAYS})
        if self.subsets:
            np.savez(out / SUBSETS_FILE, **self.subsets)
        else:
            (out / SUBSETS_FILE).unlink(missing_ok=True)  # an earlier catalogue's (--force)
        meta = self.metadata()
        (out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        return meta

    @classmethod
    def load(cls, cat_dir: str | Path, verify: bool = True) -> "Catalogue":
        """Read CAT_DIR; checks the format version, the arrays' shapes and (verify) their sha256."""
        path = Path(cat_dir)
        try:
            meta = json.loads((path / META_FILE).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{cat_dir} is not a catalogue directory (no {META_FILE}; "
                              "build one with `boundgen catalogue build`)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path / META_FILE} is not valid JSON: {exc}") from None
        except OSError as exc:  # a directory, a symlink loop, a name too long, no permission
            raise ConfigError(f"{path / META_FILE} cannot be read: {exc.strerror or exc}") from None
        if not isinstance(meta, dict):
            raise ConfigError(f"{path / META_FILE} is not a catalogue's: a JSON object was expected")
        if meta.get("format") != "boundgen-catalogue" or meta.get("format_version") != FORMAT_VERSION:
            raise ConfigError(f"{cat_dir} holds catalogue format {meta.get('format_version')!r}; "
                              f"this boundgen reads version {FORMAT_VERSION}: rebuild it")
        tokenizer, subsets = meta.get("tokenizer", {}), meta.get("subsets") or {}
        if not isinstance(tokenizer, dict) or not isinstance(subsets, dict):
            raise ConfigError(f"{path / META_FILE} is damaged: its tokenizer and its subsets (name: items) must be "
                              "JSON objects; rebuild the catalogue")
        try:
            with np.load(path / INDEX_FILE, allow_pickle=False) as arrays:
                cat = cls(**{name: arrays[name] for name in ARRAYS}, tokenizer=tokenizer)
        except _DAMAGED as exc:
            raise ConfigError(f"{path / INDEX_FILE} is missing or damaged: {exc}") from None
        if subsets:
            try:
                with np.load(path / SUBSETS_FILE, allow_pickle=False) as arrays:
                    cat.subsets = {name: arrays[name] for name in subsets}
            except _DAMAGED as exc:
                raise ConfigError(f"{path / SUBSETS_FILE} is missing or damaged: {exc}") from None
        if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in [*(getattr(cat, n) for n in ARRAYS),
                                                                 *cat.subsets.values()]):
            raise ConfigError(f"{cat_dir}: the trie's arrays are not lists of integers (damaged catalogue)")
        if len(cat.node_item) != meta.get("nodes"):
            raise ConfigError(f"{cat_dir}: the trie's arrays do not fit together (damaged catalogue)")
        if verify and cat.content_sha256() != meta.get("sha256"):
            raise ConfigError(f"{cat_dir}: the trie's content does not match the sha256 in {META_FILE}")
        check_trie(cat, str(cat_dir))
        return cat


def check_trie(cat: Catalogue, where: str) -> None:
    """The trie as `from_sequences` builds it (module docstring), or a ConfigError: a catalogue whose
    sha256 fits its content may still not be one (written by other code, or edited with its hash),
    and the server indexes the device's arrays with these numbers. O(nodes) and a sort of the item ids,
    numpy: 0.19 s of a 2M-item catalogue's 0.43 s load (6M nodes, the 2-core test VM)."""
    damaged = f"{where}: the trie's arrays do not fit together (damaged catalogue)"
    row_ptr, tokens, node_item, level_ptr = cat.row_ptr, cat.child_token, cat.node_item, cat.level_ptr
    nodes = len(node_item)
    if (nodes < 1 or len(row_ptr) != nodes + 1 or len(tokens) != nodes - 1 or len(level_ptr) < 2
            or row_ptr[0] != 0 or row_ptr[-1] != nodes - 1 or (np.diff(row_ptr) < 0).any()
            or level_ptr[0] != 0 or level_ptr[1] != 1 or level_ptr[-1] != nodes or (np.diff(level_ptr) < 0).any()):
        raise ConfigError(damaged)
    # The children of the nodes of depth d are the nodes of depth d + 1 (edge e leads to node e + 1)
    if (row_ptr[level_ptr[:-1]] + 1 != level_ptr[1:]).any():
        raise ConfigError(damaged)
    first = np.zeros(len(tokens), dtype=bool)  # each node's first edge
    first[row_ptr[:-1][row_ptr[:-1] < len(tokens)]] = True
    if len(tokens) and (tokens.min() < 0 or ((tokens[1:] <= tokens[:-1]) & ~first[1:]).any()):
        raise ConfigError(f"{where}: the trie's tokens are not ids in ascending order under each node "
                          "(damaged catalogue)")
    items = np.sort(node_item[node_item >= 0])  # (np.unique took 14x as long: 2.2 s for 2M items)
    if not len(items):
        raise ConfigError(f"{where}: the catalogue has no items")
    if (node_item < -1).any() or (items[1:] == items[:-1]).any():
        raise ConfigError(f"{where}: the trie's item ids are not distinct ids in [0, 2^63) (damaged catalogue)")


# What numpy raises on a missing, cut or edited .npz (a cut zip is BadZipFile, not an OSError).
_DAMAGED = (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile)


def _item_array(allow_items: Sequence[int]) -> np.ndarray:
    """An allow-list's distinct ids as int64; ids no item can have (past int64, not integers) name themselves."""
    ids = list(allow_items)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -2 ** 63 <= i < 2 ** 63]
    if bad:
        raise ConfigError(f"allowed items {bad[:5]} are not in the catalogue (item ids are integers in [0, 2^63))")
    return np.unique(np.asarray(ids, dtype=np.int64))


def check_subset_name(name) -> None:
    if not isinstance(name, str) or not SUBSET_NAME.fullmatch(name):
        raise ConfigError(f"subset name {name!r} is not 1-64 letters, digits, '_', '.' or '-'")


def tokenizer_sha256(model_dir: str | Path | None) -> str | None:
    """The sha256 of a directory's tokenizer.json (None: no directory known)."""
    if model_dir is None:
        return None
    return hashlib.sha256((Path(model_dir) / "tokenizer.json").read_bytes()).hexdigest()


def check_tokenizer(cat: Catalogue, model_dir: str | Path, cat_dir: str | Path = "the catalogue") -> None:
    """A catalogue built with another tokenizer than the model directory's is refused: its token
    ids would name other pieces of text."""
    want = cat.tokenizer.get("sha256")
    if want is not None and (Path(model_dir) / "tokenizer.json").is_file() and tokenizer_sha256(model_dir) != want:
        raise ConfigError(f"{cat_dir} was built with another tokenizer than {model_dir}'s tokenizer.json: "
                          "rebuild it with --tokenizer " + str(model_dir))


def pad_codes(codes: Sequence[Sequence[int]], lengths: np.ndarray) -> np.ndarray:
    """Codes -> [items, longest] int64, -1 after each code's end."""
    depth = int(lengths.max())
    flat = np.fromiter((t for c in codes for t in c), dtype=np.int64, count=int(lengths.sum()))
    matrix = np.full((len(codes), depth), -1, dtype=np.int64)
    cols = np.arange(depth)
    matrix[cols[None, :] < lengths[:, None]] = flat  # row-major: each row's tokens in order
    return matrix


def lexsort_rows(matrix: np.ndarray) -> np.ndarray:
    """The permutation that sorts the rows lexicographically (first column most significant)."""
    return np.lexsort(matrix.T[::-1])
