"""ScoreResultBuilder reads what a score program gives, by the count of its outputs: artifacts built
before the vocabulary log-sum-exp (probs, maybe top-k) serve as before, with no log-probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from boundgen.runtime.requests import ScoreResultBuilder

PROBS = np.array([[0.25, 0.75]], dtype=np.float32)
LSE, LOGITS = np.array([3.0], dtype=np.float32), np.array([[1.0, 2.0]], dtype=np.float32)
TOPK = (np.array([[5, 6, 7]]), np.array([[0.5, 0.3, 0.2]], dtype=np.float32))
LENGTHS = np.array([9])


@pytest.mark.parametrize("topk,outputs,vocab", [
    (0, (PROBS,), False), (3, (PROBS, *TOPK), False),  # built before lse
    (0, (PROBS, LSE, LOGITS), True), (3, (PROBS, LSE, LOGITS, *TOPK), True),
])
def test_outputs_by_count(topk, outputs, vocab):
    result = ScoreResultBuilder([1, 2], topk).build(*outputs, LENGTHS)
    assert result.scores.tolist() == PROBS.tolist() and result.num_tokens.tolist() == [9]
    if vocab:
        assert result.label_logprobs.dtype == np.float32 and result.label_logprobs.tolist() == [[-2.0, -1.0]]
    else:
        assert result.label_logprobs is None
    assert (result.topk_ids is not None) == bool(topk)
    if topk:
        assert result.topk_ids.tolist() == [[5, 6, 7]]
