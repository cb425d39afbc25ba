"""The compiled programs' tensors by name, and the beam stage protocol.

Every program takes the packed prompts or samples of one call:

    tokens [T] int64, positions [T] int64, cu_seqlens [B+1] int32        (PACKED)

score ("model" package) -> probs [B, C] FP32; with labels (not an MLP head) then lse [B] FP32
                           and label_logits [B, C] FP32 (VOCAB_OUTPUTS: p(label) over the whole
                           vocabulary = exp(label_logits - lse)); then topk_ids [B, k] int64,
                           topk_probs [B, k] FP32 when the spec asks for top-k (`score_outputs`).
                           Artifacts built before VOCAB_OUTPUTS existed lack them
                           (`has_vocab_outputs`): they serve probs and top-k as before.
beam  (three packages, STAGES) -> token_ids [R*W, N] int64, scores [R*W] FP32,
                           finished [R*W] bool, beam_indices [R*W, N] int64   (BEAM_OUTPUTS)
                           and, constrained to a catalogue, item_ids [R*W] int64 (ITEM_OUTPUT)

A constrained beam program also takes the catalogue's trie as inputs (TRIE, a `Trie`), so that
the catalogue is chosen when the artifact is served, not when it is built. M is the trie's node
count plus one, padded (text/catalogue_search.py); edge e leads to node e + 1:

    row_ptr [M] int64, child_token [M] int64, edge_keys [M] int64 (parent x V + token, ascending),
    node_item [M] int64 (-1: no item ends there), reach [R, M] bool (an allowed item ends at or
    below the node), ends [R, M] bool (an allowed item ends at the node)

reach and ends (FILTERS) carry each request's allow-list, one row per request of the call, so
that requests with different allow-lists share a call (`call_trie` stacks a call's rows); the
other four are the catalogue's own. Artifacts built before the rows existed took reach and ends
as [M] (TRIE_LAYOUT: the program spec's `trie_layout`): they are refused at load with a rebuild
message.

A beam search runs as prefill, `steps - 1` decode steps and finish (`run_stages`); between
them travels the search state, a `BeamState` (its fields by name, in BEAM_STATE order). It is
flattened to positional tensors only where a stage is exported and called as a package.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Callable, Sequence

PACKED = ("tokens", "positions", "cu_seqlens")
SCORE_OUTPUTS = ("probs",)
VOCAB_OUTPUTS = ("lse", "label_logits")  # label mode only
TOPK_OUTPUTS = ("topk_ids", "topk_probs")
BEAM_OUTPUTS = ("token_ids", "scores", "finished", "beam_indices")
BEAM_RESULTS = BEAM_OUTPUTS[:3]  # what a client gets (beam_indices stay on the device)
ITEM_OUTPUT = "item_ids"  # a constrained beam program's fifth output
TRIE = ("row_ptr", "child_token", "edge_keys", "node_item", "reach", "ends")  # a constrained program's inputs
Trie = namedtuple("Trie", TRIE)
FILTERS = ("reach", "ends")  # a request's allow-list: [R, M], one row per request of a call
TRIE_LAYOUT = "rows"  # a constrained program spec's trie_layout since FILTERS have rows (older: "shared")
SCORE_PACKAGE = "model"  # a score artifact's one package
STAGES = ("prefill", "step", "finish")  # a beam artifact's packages, in call order

# The search state passed between beam stages (R requests, W beams, K candidates, N steps):
BEAM_STATE = (
    "run_seq",      # [R, W, N] int64  running beams' tokens so far (-1 = not yet)
    "run_bi",       # [R, W, N] int64  their parent beam at each step
    "fin_seq",      # [R, W, N] int64  finished hypotheses, best first
    "fin_bi",       # [R, W, N] int64
    "fin_scores",   # [R, W] fp32      length-penalised scores (NEG = empty slot)
    "is_fin",       # [R, W] bool      slot holds a hypothesis
    "can_improve",  # [R] bool         HF's early-stop heuristic not yet satisfied
    "done",         # [R] bool         the request's search has ended (finished set frozen)
    "cand_scores",  # [R, K] fp32      this step's candidates, best first
    "cand_tokens",  # [R, K] int64
    "cand_parent",  # [R, K] int64     parent beam within the request
)
BeamState = namedtuple("BeamState", BEAM_STATE)
# Around the state: the prompt K/V (written by prefill, read by every step) and the beams' suffix K/V.
PREFIX_KV = ("prefix_k", "prefix_v")  # [layers, T, N_kv, D]
SUFFIX_KV = ("suffix_k", "suffix_v")  # [layers, R*W, N-1, N_kv, D]


def score_outputs(topk: int, vocab: bool = True) -> tuple[str, ...]:
    """A score program's outputs in order; vocab: with VOCAB_OUTPUTS (label mode; False for an MLP
    head, and for artifacts built before them)."""
    return SCORE_OUTPUTS + (VOCAB_OUTPUTS if vocab else ()) + (TOPK_OUTPUTS if topk else ())


def has_vocab_outputs(interface: dict) -> bool:
    """Whether an artifact's recorded tensors (the manifest's "interface") include VOCAB_OUTPUTS."""
    return all(name in interface.get("tensors", {}) for name in VOCAB_OUTPUTS)


def call_trie(tries: Sequence[Trie]) -> Trie:
    """The program's trie inputs for a call of these requests' tries (one catalogue, reach and ends
    [M] each): its arrays, and reach and ends [R, M] with request r's allow-list on row r."""
    def rows(name):
        first = getattr(tries[0], name)
        out = first.new_empty((len(tries), first.shape[0]))
        for row, trie in zip(out, tries):
            row.copy_(getattr(trie, name))
        return out

    return tries[0]._replace(**{name: rows(name) for name in FILTERS})


def run_stages(prefill: Callable, step: Callable, finish: Callable, step_ids: Sequence, tokens, positions,
               cu_seqlens, trie: Sequence = ()):
    """The beam search over its stages: prefill, one decode step per entry of `step_ids` (the
    [1] int64 step tensors, allocated once by the caller so that a CUDA graph sees stable
    addresses), finish. The stages are the program's methods or their compiled packages; both
    take and return flat sequences (the positional form of PREFIX_KV, SUFFIX_KV and BeamState).
    trie: a constrained program's TRIE tensors (empty for the plain search), passed to every
    stage after its packed inputs (finish: first)."""
    prefix_k, prefix_v, *state = prefill(tokens, positions, cu_seqlens, *trie)
    for step_id in step_ids:
        state = step(step_id, prefix_k, prefix_v, cu_seqlens, *trie, *state)
    return finish(*trie, *state[len(SUFFIX_KV):])  # the suffix K/V are not needed past the last step
