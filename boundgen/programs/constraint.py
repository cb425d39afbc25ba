"""A catalogue as a constraint on beam search: each beam's trie node, its allowed tokens, its item.

The beam program (programs/beam.py) asks three things of it, all tensor code over the trie's
arrays (text/catalogue.py) held as buffers:

    nodes(seq [B, N] int64, -1 after the end)  -> [B] int64   the node each beam's tokens lead to
                                                              (-1: not a prefix of an allowed item)
    bias(nodes [B], root: bool)               -> [B, V] FP32  0 on allowed tokens, -inf elsewhere
                                                              (ops/trie_mask.py)
    items(seq [B, N])                         -> [B] int64    the item a finished sequence names, -1 if none

`nodes` walks the trie from the root over the N token columns (a static loop; stop tokens and -1
leave the node as it is): each step one `searchsorted` of (node x stride + token) in the edges'
sorted keys (parent node x stride + token, sorted since parents are numbered level by level and
children by token). Recomputing the nodes from the sequences keeps the search state as it is
(no node column in BeamState), so the unconstrained program is unchanged.

Semantics (the same as HF `generate(prefix_allowed_tokens_fn=f)` where f returns the node's child
tokens, plus the first stop token where an allowed item ends): a beam may generate a child token
of its node; where an item ends, the program's first stop token ends the beam as a finished
hypothesis (so codes shorter than N need a stop token; its log-prob counts in the score; only the
first, so that an item comes back once, not once per stop token); a code of N tokens finishes at
max length. The allow-list (a subset of
item ids) keeps only children whose subtree holds an allowed item and stop tokens only at allowed
items' ends.

Checked at construction against the program: no code longer than N, every token id inside the
model's vocabulary, no stop token inside a code (it would end the beam mid-code), and stop tokens
when some code is shorter than N.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from boundgen.errors import ConfigError
from boundgen.ops import trie_mask
from boundgen.text.catalogue import Catalogue


class CatalogueConstraint(nn.Module):
    def __init__(self, catalogue: Catalogue, vocab: int, steps: int, stop_token_ids: Sequence[int] = (),
                 allow_items: Sequence[int] | None = None):
        super().__init__()
        cat = catalogue
        self.vocab = int(vocab)
        if cat.depth > steps:
            raise ConfigError(f"the catalogue's longest token sequence has {cat.depth} tokens; "
                              f"this beam search generates {steps} (--steps)")
        if int(cat.child_token.max(initial=0)) >= vocab:
            raise ConfigError(f"the catalogue holds token id {int(cat.child_token.max())}, outside the model's "
                              f"vocabulary [0, {vocab})")
        stops = [int(t) for t in stop_token_ids]
        if stops and bool(torch.isin(torch.from_numpy(cat.child_token.astype("int64")), torch.tensor(stops)).any()):
            raise ConfigError(f"the catalogue's token sequences contain a stop token ({stops}): a beam would end "
                              "inside an item; pass other --stop-token-ids or rebuild the catalogue")
        below = cat.level_ptr[min(steps, len(cat.level_ptr) - 1)]  # nodes of depth < steps
        has_short = bool((cat.node_item[:below] >= 0).any())
        if has_short and not stops:
            raise ConfigError(f"some of the catalogue's items are shorter than --steps {steps} tokens: they end "
                              "with a stop token, and this beam search has none (pass --stop-token-ids)")
        ends, reach = cat.reachable(allow_items)
        if not reach[0]:
            raise ConfigError("no item of the catalogue is allowed")
        parent = cat.parent()[1:]
        self.stride = max(self.vocab, int(cat.child_token.max(initial=0)) + 1)
        self.root_degree = int(cat.max_degree()[0])
        self.max_degree = max(cat.max_degree()[1:] or [0])
        buffer = lambda name, array: self.register_buffer(name, torch.from_numpy(array), persistent=False)  # noqa: E731
        buffer("row_ptr", cat.row_ptr.astype("int64"))
        buffer("child_token", cat.child_token.astype("int64"))
        buffer("edge_keys", parent.astype("int64") * self.stride + cat.child_token.astype("int64"))
        buffer("node_item", cat.node_item.astype("int64"))
        buffer("reach", reach)
        buffer("ends", ends)
        self.register_buffer("stop_token_ids", torch.tensor(stops, dtype=torch.int64), persistent=False)

    def nodes(self, seq: torch.Tensor) -> torch.Tensor:
        """seq [B, N] int64 (-1 after the end) -> [B] int64 node, -1 off the catalogue."""
        node = torch.zeros(seq.shape[0], dtype=torch.int64, device=seq.device)
        last = self.edge_keys.shape[0] - 1
        for col in range(seq.shape[1]):
            token = seq[:, col]
            active = (token >= 0) & ~torch.isin(token, self.stop_token_ids)
            key = node * self.stride + token
            at = torch.searchsorted(self.edge_keys, key).clamp(max=last)
            found = (self.edge_keys[at] == key) & (node >= 0)
            node = torch.where(active, torch.where(found, at + 1, torch.full_like(at, -1)), node)
        return node

    def bias(self, nodes: torch.Tensor, root: bool = False) -> torch.Tensor:
        """nodes [B] -> [B, V] FP32 additive mask of the allowed tokens (ops/trie_mask.py)."""
        degree = self.root_degree if root else max(self.max_degree, 1)
        return trie_mask.reference(nodes, self.row_ptr, self.child_token, self.reach, self.ends,
                                   self.stop_token_ids[:1], self.vocab, degree)

    def items(self, seq: torch.Tensor) -> torch.Tensor:
        """seq [B, N] (a finished sequence, -1 after its end) -> [B] int64 item id, -1 if it names none
        (or names an item the allow-list leaves out)."""
        node = self.nodes(seq)
        safe = node.clamp(min=0)
        return torch.where((node >= 0) & self.ends[safe], self.node_item[safe], torch.full_like(node, -1))
