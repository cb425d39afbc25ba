"""The compiled peer: what a competent PyTorch user adds to the HF model in an afternoon.

score (W1): the whole score function (decoder, gather of each sample's last token, LM head,
label softmax) under `torch.compile(mode="reduce-overhead", dynamic=True)`: one Inductor compile
for every bucket shape (batch and length are symbolic), and one CUDA graph recorded per shape
when the peer warms it up. Requests are right-padded to buckets without a mask (bench/peer.py),
so attention is plainly causal. transformers builds that causal mask as a tensor while dynamo
traces (masking_utils `_ignore_causal_mask_sdpa`: with torch < 2.14 it never skips under
compile), which sends sdpa to its masked kernel instead of the causal flash one; the attention
implementation registered here (`CAUSAL_SDPA`) is transformers' own sdpa with a mask function
that returns no mask when there is nothing to mask (no padding mask, no cache offset, as many
keys as queries) and transformers' sdpa mask otherwise. Under compile transformers also wraps
the causal mask with a packed-sequence mask, since it cannot read the position ids while
tracing; the score path passes no position ids (each row counts from 0), so causal is exact.

beam (W2/W3): `generate(..., cache_implementation="static")` with the decode step compiled.
In transformers 5.17 and 5.24, `generate` compiles the forward by itself only in `_sample`
(and assisted decoding): `_beam_search` calls `self(...)` directly, so beam search never runs
compiled unless the user compiles the forward. The static cache itself works with beam search
(same candidates and scores as the dynamic cache), but `StaticLayer` inherits a
`reorder_cache` that replaces its key/value tensors (`index_select`) at every step, which
drops the static addresses CUDA graphs need; `compile_decode` makes that reorder write in place.
The prefill stays eager, as transformers does for sampling (a new shape per prompt length, run
once per request); decode steps (one token per beam) go through
`torch.compile(mode="reduce-overhead", dynamic=True)`. A static cache sized for one batch is
rebuilt when the number of prompts in a call changes, so the compiled beam peer runs one
request a call.
"""

from __future__ import annotations

CAUSAL_SDPA = "boundgen_causal_sdpa"


def register_causal_attention() -> str:
    """Register `CAUSAL_SDPA` with transformers (idempotent) and return its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def mask(*args, **kwargs):
        offset = kwargs.get("q_offset", 0)
        plain = (kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
                 and isinstance(offset, int) and offset == 0 and kwargs.get("q_length") == kwargs.get("kv_length"))
        return None if plain else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(CAUSAL_SDPA, mask)
    return CAUSAL_SDPA


def compile_score(model, score_fn, mode: str = "reduce-overhead"):
    """`score_fn(ids, last, labels)` compiled, with `model` switched to the causal sdpa attention."""
    import torch

    model.set_attn_implementation(register_causal_attention())
    compiled = torch.compile(score_fn, mode=mode, dynamic=True)

    def run(*args):
        torch.compiler.cudagraph_mark_step_begin()  # the previous call's outputs were copied out
        return compiled(*args)

    return run


def compile_decode(model, mode: str = "reduce-overhead") -> None:
    """Route `model`'s one-token forward calls (beam decode steps) through torch.compile; make the
    static cache reorder its beams in place."""
    import torch
    from transformers.cache_utils import StaticLayer

    StaticLayer.reorder_cache = _reorder_in_place
    eager = model.forward
    compiled = torch.compile(eager, mode=mode, dynamic=True)

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] == 1:
            torch.compiler.cudagraph_mark_step_begin()  # generate copied the previous step's logits out
            return compiled(*args, **kwargs)
        return eager(*args, **kwargs)

    model.forward = forward


def _reorder_in_place(self, beam_idx) -> None:
    """StaticLayer.reorder_cache writing into the same tensors (their addresses stay static)."""
    if self.is_initialized:
        idx = beam_idx.to(self.keys.device)
        self.keys.copy_(self.keys.index_select(0, idx))
        self.values.copy_(self.values.index_select(0, idx))
