"""Score program: one packed prefill over all samples of a request, read each sample's last token.

Inputs (packed, no padding): tokens [T] int64, positions [T] int64, cu_seqlens [B+1] int32.
Outputs, FP32 (names and order: artifact/tensors.py score_outputs):
- label mode: probs [B, L] = softmax over the label tokens' next-token logits at each sample's
  last token (the L label rows of the LM head, as a model-dtype GEMM); then
  lse [B] = log-sum-exp of the full next-token logits [B, V] and label_logits [B, L] = those
  logits at the label ids, so that p(label) over the whole vocabulary is exp(label_logits - lse)
  exactly in FP32 (SGLang's `apply_softmax: false`). Both come from the one full LM head GEMM
  (B x H x V FLOPs: for 15 samples of a 0.6B Qwen ~4.7 GFLOP, the LM head's weights read once).
- head mode: the MLP head's output [B, C] over the last-token hidden state (see programs/head.py).
- with `topk` > 0 also (topk_ids [B, k] int64, topk_probs [B, k]) over the full vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from boundgen.errors import ConfigError
from boundgen.model.qwen import QwenModel
from boundgen.programs.head import MLPHead


class ScoreProgram(nn.Module):
    def __init__(self, model: QwenModel, label_token_ids: list[int] | None = None, topk: int = 0,
                 head: MLPHead | None = None, max_tokens_per_sample: int | None = None):
        """max_tokens_per_sample: the bound the packer holds every sample to (template included),
        for attention lowerings that size their grid by it; None: no bound."""
        super().__init__()
        if head is None and not label_token_ids:
            raise ValueError("a score program needs label token ids or an MLP head")
        if topk < 0 or topk > model.cfg.vocab_size:
            raise ConfigError(f"topk must be in [0, {model.cfg.vocab_size}] (the vocabulary), got {topk}")
        self.model = model
        self.head = head
        self.topk = topk
        self.max_tokens_per_sample = max_tokens_per_sample
        ids = torch.tensor(list(label_token_ids or []), dtype=torch.int64)
        self.register_buffer("label_token_ids", ids, persistent=False)

    @property
    def num_classes(self) -> int:
        """Columns of `probs`: the MLP head's classes, else the labels."""
        return self.head.num_classes if self.head is not None else len(self.label_token_ids)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor):
        hidden, _ = self.model.prefill(tokens, positions, cu_seqlens, max_seqlen=self.max_tokens_per_sample)  # [T, H]
        last = hidden[cu_seqlens[1:].to(torch.int64) - 1]  # [B, H]
        logits = None  # [B, V] FP32, computed once when an output needs the whole vocabulary
        if self.head is not None:
            out = (self.head(last),)
        else:
            label_rows = self.model.lm_head_weight[self.label_token_ids]  # [L, H]
            label_logits = F.linear(last, label_rows)  # [B, L], model dtype as the full LM head would give
            logits = self.model.logits(last).to(torch.float32)  # [B, V]
            out = (torch.softmax(label_logits.to(torch.float32), dim=-1),  # probs [B, L]
                   torch.logsumexp(logits, dim=-1),  # lse [B]
                   logits[:, self.label_token_ids])  # label_logits [B, L], the ones lse was summed over
        if self.topk:
            if logits is None:
                logits = self.model.logits(last).to(torch.float32)
            probs = torch.softmax(logits, dim=-1)  # [B, V]
            top_probs, top_ids = torch.topk(probs, self.topk, dim=-1)
            out = out + (top_ids, top_probs)
        return out
