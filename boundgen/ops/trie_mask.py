"""The tokens each beam may generate next under a catalogue, as an additive mask over the vocabulary.

    nodes [B] int64 (each beam's trie node; -1: a beam off the catalogue), the trie in CSR form
    (text/catalogue.py): row_ptr [nodes + 1] int64, child_token [edges] int64 (edge e leads to
    node e + 1), reach [nodes] bool (an allowed item lies at or below the node), ends [nodes] bool
    (an allowed item ends at the node), stop_token_ids [S] int64 (the tokens that may end an
    item), vocab V, max_degree D (at least the children of any node given)
    -> bias [B, V] FP32: 0 on the allowed tokens, -inf elsewhere.

Allowed after node n: each child token whose child node is `reach`able, and the stop tokens when
an allowed item ends at n (the beam then ends as HF ends a beam on a stop token). A beam at -1,
or at a node whose subtree holds no allowed item, is allowed nothing: its candidates score -inf.

Gather-based and vectorised over beams (the CSR lookup of STATIC, Su et al. 2025): each beam's
children are the D slots row_ptr[n] + 0 .. D - 1, those past its degree sent to a spare column
V; one scatter of zeros into a [B, V + 1] row of -inf writes the mask, and the spare column is
dropped. Cost O(B x (V + D + S)): the same order as the logits it is added to. D is a bound the
caller fixes per call (the root's degree for the prompt's step, the largest below it for the
decode steps), so shapes stay static under export.

Only a torch implementation so far (`reference`); a Triton kernel would fuse the mask into the
selection (ops/vocab_topk.py) so that no [B, V] mask is written.
"""

from __future__ import annotations

import torch


def reference(nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor, reach: torch.Tensor,
              ends: torch.Tensor, stop_token_ids: torch.Tensor, vocab: int, max_degree: int) -> torch.Tensor:
    beams = nodes.shape[0]
    alive = nodes >= 0
    node = nodes.clamp(min=0)
    start = row_ptr[node]  # [B]
    degree = torch.where(alive, row_ptr[node + 1] - start, torch.zeros_like(start))
    slot = torch.arange(max(max_degree, 1), device=nodes.device)  # [D]
    edge = (start[:, None] + slot[None, :]).clamp(max=max(child_token.shape[0] - 1, 0))  # [B, D]
    valid = (slot[None, :] < degree[:, None]) & reach[edge + 1]
    spare = torch.full_like(edge, vocab)
    cols = torch.where(valid, child_token[edge], spare)
    if stop_token_ids.numel():
        stops = stop_token_ids[None, :].expand(beams, -1)
        cols = torch.cat((cols, torch.where((alive & ends[node])[:, None], stops, torch.full_like(stops, vocab))), 1)
    bias = torch.full((beams, vocab + 1), float("-inf"), dtype=torch.float32, device=nodes.device)
    bias = bias.scatter(1, cols, torch.zeros_like(cols, dtype=torch.float32))
    return bias[:, :vocab]


IMPLEMENTATIONS = {"torch": reference}
