"""A catalogue as a constraint on beam search: each beam's trie node, its allowed tokens, its item.

The beam program (programs/beam.py) asks these of it, all tensor code over the trie's
arrays (a `Trie` of artifact/tensors.py: text/catalogue_search.py makes them from a catalogue):

    nodes(trie, seq [B, N] int64, -1 after the end) -> [B] int64   the node each beam's tokens lead to
                                                                   (-1: not a prefix of an allowed item)
    mask(trie_mask, trie, nodes [B], logp, root)    logp [B, V] FP32 in place: -inf on the tokens
                                                                   the nodes bar (ops/trie_mask.py, as lowered)
    topk(trie_topk, trie, nodes, logits, bias, k)   -> logp, ids [B, k]: a decode step's top k over the
                                                                   allowed tokens alone (ops/trie_topk.py, the
                                                                   default), in place of mask + top K over V
    items(trie, seq [B, N])                         -> [B] int64   the item a finished sequence names, -1 if none

Where the trie comes from: built from a catalogue (`CatalogueConstraint(cat, ...)`: the eager
program, its arrays held as buffers, `own_trie()`), or given to every call as program inputs
(`CatalogueConstraint.inputs(...)`: a compiled constrained artifact, whose catalogue is loaded at
serve time). Only the lookup bound differs: the mask looks a node's children up in D slots, D the
root's degree or the largest below it for a known catalogue; for trie inputs the vocabulary at the
root (no node has more children) and the build's `catalogue_max_degree` below it. Extra slots
hold nothing, so both give the same mask.

`nodes` walks the trie from the root over the N token columns (a static loop; stop tokens and -1
leave the node as it is): each step one `searchsorted` of (node x V + token) in the edges'
sorted keys (parent node x V + token, sorted since parents are numbered level by level and
children by token). Recomputing the nodes from the sequences keeps the search state as it is
(no node column in BeamState), so the unconstrained program is unchanged.

Semantics (the same as HF `generate(prefix_allowed_tokens_fn=f)` where f returns the node's child
tokens, plus the first stop token where an allowed item ends): a beam may generate a child token
of its node; where an item ends, the program's first stop token ends the beam as a finished
hypothesis (so codes shorter than N need a stop token; its log-prob counts in the score; only the
first, so that an item comes back once, not once per stop token); a code of N tokens finishes at
max length. The allow-list (a subset of item ids) keeps only children whose subtree holds an
allowed item and stop tokens only at allowed items' ends (the trie's reach and ends arrays).
Those two are [Q, M], one row per request of the call or one for all (Q = 1: the eager
program's own catalogue): beam b reads row b // (B / Q) (ops/trie_mask.py `filter_rows`), so that
requests with different allow-lists share a call.

Checked at construction against the program (text/catalogue_search.py `check`): no code longer
than N, every token id inside the model's vocabulary, no stop token inside a code, and stop
tokens when some code is shorter than N.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from boundgen.artifact.tensors import FILTERS, TRIE, Trie
from boundgen.ops.trie_mask import filter_rows
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue


class CatalogueConstraint(nn.Module):
    def __init__(self, catalogue: Catalogue | None, vocab: int, steps: int, stop_token_ids: Sequence[int] = (),
                 allow_items: Sequence[int] | None = None, max_degree: int | None = None):
        """catalogue None: the trie comes with every call (`inputs`); max_degree then bounds the
        children of a node below the root."""
        super().__init__()
        self.vocab = int(vocab)
        stops = [int(t) for t in stop_token_ids]
        self.register_buffer("stop_token_ids", torch.tensor(stops, dtype=torch.int64), persistent=False)
        self.has_trie = catalogue is not None
        if catalogue is None:
            self.root_degree, self.max_degree = self.vocab, int(max_degree)
            return
        cat = catalogue
        catalogue_search.check(cat, self.vocab, steps, stops, max_degree)
        arrays = catalogue_search.arrays(cat, self.vocab, catalogue_search.allowed(cat, allow_items))
        self.root_degree = int(cat.max_degree()[0])
        self.max_degree = max(cat.max_degree()[1:] or [0])
        for name in TRIE:
            array = torch.from_numpy(arrays[name])
            self.register_buffer(name, array[None] if name in FILTERS else array, persistent=False)

    @classmethod
    def inputs(cls, vocab: int, steps: int, stop_token_ids: Sequence[int], max_degree: int) -> "CatalogueConstraint":
        """A constraint whose trie is given to every call (a compiled artifact's program inputs)."""
        return cls(None, vocab, steps, stop_token_ids, max_degree=max_degree)

    def own_trie(self) -> Trie | None:
        """The catalogue's arrays held as buffers; None when the trie comes with every call."""
        return Trie(*(getattr(self, name) for name in TRIE)) if self.has_trie else None

    def nodes(self, trie: Trie, seq: torch.Tensor) -> torch.Tensor:
        """seq [B, N] int64 (-1 after the end) -> [B] int64 node, -1 off the catalogue."""
        node = torch.zeros(seq.shape[0], dtype=torch.int64, device=seq.device)
        last = trie.edge_keys.shape[0] - 1
        for col in range(seq.shape[1]):
            token = seq[:, col]
            active = (token >= 0) & ~torch.isin(token, self.stop_token_ids)
            key = node * self.vocab + token
            at = torch.searchsorted(trie.edge_keys, key).clamp(max=last)
            found = (trie.edge_keys[at] == key) & (node >= 0)
            node = torch.where(active, torch.where(found, at + 1, torch.full_like(at, -1)), node)
        return node

    def mask(self, trie_mask: Callable, trie: Trie, nodes: torch.Tensor, logp: torch.Tensor,
             root: bool = False) -> None:
        """logp [B, V] FP32 in place: -inf on the tokens the beams' nodes [B] do not allow, the
        others untouched. trie_mask: the in-place op as lowered (`Ops.trie_mask`, ops/trie_mask.py),
        which takes the program's trie arrays as they are (one length M)."""
        degree = self.root_degree if root else max(self.max_degree, 1)
        trie_mask(logp, nodes, trie.row_ptr, trie.child_token, trie.reach, trie.ends, self.stop_token_ids[:1], degree)

    def topk(self, trie_topk: Callable, trie: Trie, nodes: torch.Tensor, logits: torch.Tensor,
             bias: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's selection: each beam's top k tokens among those its node [B] allows,
        with FP32 log-probs (logits [B, V]; bias [V] FP32 or None, added after the log-softmax).
        trie_topk: the fused op as lowered (`Ops.trie_topk`, ops/trie_topk.py), or its `separate`
        composition with the trie_mask op as lowered."""
        return trie_topk(logits, nodes, trie.row_ptr, trie.child_token, trie.reach, trie.ends,
                         self.stop_token_ids[:1], bias, k, max(self.max_degree, 1))

    def items(self, trie: Trie, seq: torch.Tensor) -> torch.Tensor:
        """seq [B, N] (a finished sequence, -1 after its end) -> [B] int64 item id, -1 if it names none
        (or names an item the allow-list leaves out)."""
        node = self.nodes(trie, seq)
        safe = node.clamp(min=0)
        row = filter_rows(seq.shape[0], trie.ends.shape[0], seq.device)
        return torch.where((node >= 0) & trie.ends[row, safe], trie.node_item[safe], torch.full_like(node, -1))
