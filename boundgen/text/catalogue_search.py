"""A catalogue as the inputs of a beam search: the checks against the search, the arrays it reads.

A constrained beam program (programs/beam.py, programs/constraint.py) reads the trie as the TRIE
tensors of artifact/tensors.py; the eager program holds them as buffers, a compiled artifact
takes them as inputs, so that the catalogue is chosen when the artifact is served:

    check(cat, vocab, steps, stop_token_ids, max_degree)  the catalogue fits the search, else ConfigError
    arrays(cat, vocab, allow)                             {TRIE name: numpy array}, all of one length M
    allowed(cat, allow_items)                             (reach, ends) of an allow-list, else ConfigError
    padded(cat, allow)                                    those two padded to M, as `arrays` pads them
    length(nodes)                                         M, the arrays' length for a trie of `nodes` nodes

Every array has one length, M = max(nodes, MIN_NODES) + 1 (row_ptr's), so that a compiled
program has one dynamic dim for them all (at least MIN_NODES + 1: export specialises sizes 0 and
1): the padding appends nodes without children or items, and edges that no node owns, with keys
above every real key (the keys stay sorted). The same padding to any longer length leaves a
search unchanged (a request context's fixed-length buffers for CUDA graphs, runtime/context.py;
tests/runtime/test_trie_buffers.py). No torch here (runtime/ and programs/ both read it).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from boundgen.errors import ConfigError
from boundgen.text.catalogue import Catalogue

MIN_NODES = 3
PAD_KEY = np.iinfo(np.int64).max
# What each array is padded with past the trie's entries; row_ptr with its last value (no children).
PADDING = {"child_token": 0, "edge_keys": PAD_KEY, "node_item": -1, "reach": False, "ends": False}


def check(cat: Catalogue, vocab: int, steps: int, stop_token_ids: Sequence[int] = (),
          max_degree: int | None = None) -> None:
    """Whether a beam search of `steps` tokens over a vocabulary of `vocab` can walk the
    catalogue: no code longer than steps, every token inside the vocabulary, no stop token inside
    a code, a stop token where some code is shorter than steps, and (a compiled program) no node
    below the root with more than `max_degree` children."""
    if cat.depth > steps:
        raise ConfigError(f"the catalogue's longest token sequence has {cat.depth} tokens; "
                          f"this beam search generates {steps} (--steps)")
    if int(cat.child_token.min(initial=0)) < 0:
        raise ConfigError(f"the catalogue holds token id {int(cat.child_token.min())}, outside the model's "
                          f"vocabulary [0, {vocab})")
    if int(cat.child_token.max(initial=0)) >= vocab:
        raise ConfigError(f"the catalogue holds token id {int(cat.child_token.max())}, outside the model's "
                          f"vocabulary [0, {vocab}): it was built for another model")
    stops = [int(t) for t in stop_token_ids]
    if stops and np.isin(cat.child_token.astype(np.int64), stops).any():
        raise ConfigError(f"the catalogue's token sequences contain a stop token ({stops}): a beam would end "
                          "inside an item; pass other --stop-token-ids or rebuild the catalogue")
    below = cat.level_ptr[min(steps, len(cat.level_ptr) - 1)]  # nodes of depth < steps
    if (cat.node_item[:below] >= 0).any() and not stops:
        raise ConfigError(f"some of the catalogue's items are shorter than --steps {steps} tokens: they end "
                          "with a stop token, and this beam search has none (pass --stop-token-ids)")
    deeper = max(cat.max_degree()[1:] or [0])
    if max_degree is not None and deeper > max_degree:
        raise ConfigError(f"a node of the catalogue has {deeper} children; this artifact looks up at most "
                          f"{max_degree} (rebuild it with --catalogue-max-degree {deeper} or more)")


def allowed(cat: Catalogue, allow_items: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reach [nodes] bool, ends [nodes] bool) of an allow-list (None: every item). Ids that are
    not in the catalogue, or a list that leaves nothing to generate, are a ConfigError."""
    ends, reach = cat.reachable(allow_items)
    if not reach[0]:
        raise ConfigError("the allow-list leaves no item of the catalogue to generate")
    return reach, ends


def arrays(cat: Catalogue, vocab: int, allow: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The TRIE arrays (artifact/tensors.py) of the catalogue, each of length M = max(nodes,
    MIN_NODES) + 1 (module docstring); allow: (reach, ends) from `allowed` (None: every item)."""
    reach, ends = allow if allow is not None else allowed(cat)
    m = length(cat.num_nodes)
    parent = cat.parent()[1:]
    child = cat.child_token.astype(np.int64)
    entries = {"child_token": child, "edge_keys": parent * vocab + child,
               "node_item": cat.node_item.astype(np.int64), "reach": reach, "ends": ends}
    return {"row_ptr": _pad(cat.row_ptr.astype(np.int64), m, cat.row_ptr[-1]),
            **{name: _pad(array, m, PADDING[name]) for name, array in entries.items()}}


def padded(cat: Catalogue, allow: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(reach, ends) from `allowed`, padded as `arrays` pads them (a request's allow-list)."""
    m = length(cat.num_nodes)
    return _pad(allow[0], m, PADDING["reach"]), _pad(allow[1], m, PADDING["ends"])


def length(nodes: int) -> int:
    """M, the TRIE arrays' one length for a trie of `nodes` nodes (module docstring)."""
    return max(int(nodes), MIN_NODES) + 1


def _pad(array: np.ndarray, m: int, value) -> np.ndarray:
    """array followed by `value` up to `m` entries."""
    if len(array) == m:
        return np.ascontiguousarray(array)
    return np.concatenate((array, np.full(m - len(array), value, dtype=array.dtype)))
