"""Each beam's top K tokens among those its trie node allows, with FP32 log-softmax values: the
expansion step of a constrained beam search, without a [B, V] mask or a top K over the vocabulary.

    logits [B, V] (model dtype), nodes [B] int64 (each beam's trie node; -1: off the catalogue),
    the trie's arrays as ops/trie_mask.py takes them (row_ptr, child_token [M]; reach, ends
    [Q, M], beam b reading row b // (B / Q)), stop_token_ids [S] int64 (the tokens that may end
    an item), bias [V] FP32 or None (-inf on tokens barred by min_new_tokens), k, max_degree D (at
    least the children of any node)
    -> logp [B, k] FP32, ids [B, k] int64, best first:
    logp = the k largest of (log_softmax(logits in FP32) + bias) over the tokens the node allows
    ids  = their tokens
    Where fewer than k tokens are allowed, the other slots hold logp -inf and token 0 (a real
    token: a beam that carries it on scores -inf, as under the mask).

This is what the separate ops give (lowering "separate", the default before this op: the FP32
log-softmax of the whole row, ops/trie_mask.py writing -inf on every token the node bars, then
torch.topk over the row), for every slot of finite logp: the same tokens with the same values, in
the same order up to equal values, whose order torch.topk leaves unspecified on either path.

Why: a beam's node allows at most D + S tokens (a decode step's node has tens of children where
the vocabulary has 151,936), so the top K is taken over the [B, D + S] list of allowed tokens
(`trie_mask.allowed_tokens`: the node's D child slots in token order, the stop tokens where an
item ends, V in the slots that hold none) with their log-probs gathered, instead of over [B, V].
On the H200 the separate ops' torch.topk over [B, V] FP32 alone costs 0.42 / 2.3 ms at B = 100 /
800 (ops/vocab_topk.py), each decode step; this op's is over [B, max(D + S, k)].

Lowering "torch" (the reference): the FP32 log-softmax, gathered at the allowed tokens; a build
leaves the rest to Inductor. Compiled, on the H200 at 800 beams, it takes 0.24 ms a step at D = 58
and 0.35 ms at D = 4,096, against 0.36 ms for the plain program's selection and 3.3 ms for the
separate ops (python -m boundgen.bench.catalogue, docs/benchmarks.md). D is the program's bound
(the build's catalogue_max_degree for trie inputs): the gather and top K are [B, D + S] wide
whatever the catalogue's own degree, so a build whose catalogues have few children a node gains
from a smaller --catalogue-max-degree, and one whose nodes have tens of thousands (titles) reads
a large share of the vocabulary a beam, where the mask's Triton kernel reads a node's children.
"""

from __future__ import annotations

from typing import Optional

import torch

from boundgen.ops.trie_mask import allowed_tokens, apply_reference


def reference(logits: torch.Tensor, nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor,
              reach: torch.Tensor, ends: torch.Tensor, stop_token_ids: torch.Tensor, bias: Optional[torch.Tensor],
              k: int, max_degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    beams, vocab = logits.shape
    cols = allowed_tokens(nodes, row_ptr, child_token, reach, ends, stop_token_ids, vocab, max_degree)
    if cols.shape[1] < k:  # fewer slots than k: the rest hold no token
        cols = torch.cat((cols, torch.full((beams, k - cols.shape[1]), vocab, dtype=cols.dtype, device=cols.device)),
                         1)
    open_ = cols < vocab
    safe = torch.where(open_, cols, torch.zeros_like(cols))
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1).gather(1, safe)
    if bias is not None:
        logp = logp + bias[safe]
    logp = torch.where(open_, logp, torch.full_like(logp, float("-inf")))
    best = torch.topk(logp, k, dim=-1)
    return best.values, safe.gather(1, best.indices)


def separate(logits: torch.Tensor, nodes: torch.Tensor, row_ptr: torch.Tensor, child_token: torch.Tensor,
             reach: torch.Tensor, ends: torch.Tensor, stop_token_ids: torch.Tensor, bias: Optional[torch.Tensor],
             k: int, max_degree: int, mask=apply_reference) -> tuple[torch.Tensor, torch.Tensor]:
    """The separate ops this op replaces (lowering "separate", what a constrained program composes
    then, with `mask` the trie_mask op as lowered): the FP32 log-softmax of the whole row, -inf
    written in place on the tokens the node bars, the bias added, torch.topk over the row."""
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    mask(logp, nodes, row_ptr, child_token, reach, ends, stop_token_ids, max_degree)
    if bias is not None:
        logp = logp + bias
    return torch.topk(logp, k, dim=-1)


# Lowerings by name (`OpLowering.trie_topk`): "torch", the default since its end-to-end A/B on the
# H200 (docs/benchmarks.md); "separate" (None): the program composes `separate` with its trie_mask
# op as lowered (programs/beam.py).
IMPLEMENTATIONS = {"separate": None, "torch": reference}
