"""What an engine returns to its caller (server, CLI, bench). Plain numpy, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# An engine result's `timings` are seconds by stage, but for these counts of the request's call:
# requests in the call it rode in, and its input tokens.
TIMING_COUNTS = frozenset({"batch_requests", "input_tokens"})

@dataclass
class ScoreResult:
    scores: np.ndarray  # [N, num_labels] float32: softmax over label-token logits per sample
    label_token_ids: list[int]
    timings: dict[str, float] = field(default_factory=dict)  # seconds: "pre", "model", "post"
    topk_ids: np.ndarray | None = None  # [N, k] int32 when the program has top-k enabled
    topk_probs: np.ndarray | None = None  # [N, k] float32
    # Label mode of programs that have them (artifact/tensors.py VOCAB_OUTPUTS; None for an MLP head
    # or an artifact built before them): each label's log-probability over the whole vocabulary,
    # label_logit - lse of the program's FP32 outputs; exp of it is SGLang's apply_softmax false.
    label_logprobs: np.ndarray | None = None  # [N, num_labels] float32
    num_tokens: np.ndarray | None = None  # [N] int64: tokens each sample ran (template included)


@dataclass
class BeamResult:
    token_ids: np.ndarray  # [W, N_gen] int32, -1 after a stop token
    scores: np.ndarray  # [W] float32, sum of FP32 log-probs (length_penalty applied), best first
    finished: np.ndarray  # [W] bool: ended with a stop token
    texts: list[str]  # [W] decoded generated tokens (stop token and padding left out)
    timings: dict[str, float] = field(default_factory=dict)
    # [W] int64 under a catalogue: the item each candidate names; -1 for a missing candidate
    # (fewer than W items reachable: token ids all -1, score -inf)
    item_ids: np.ndarray | None = None

    def candidates(self) -> list[dict]:
        """The CLI's JSON candidates: generated ids (no padding), text, score (null when -inf: a
        missing candidate), and item_id under a catalogue."""
        out = []
        for i, (ids, text, score) in enumerate(zip(self.token_ids, self.texts, self.scores)):
            cand = {"token_ids": [int(t) for t in ids if t >= 0], "text": text,
                    "score": float(score) if np.isfinite(score) else None}
            if self.item_ids is not None:
                cand["item_id"] = int(self.item_ids[i])
            out.append(cand)
        return out
