"""Fixed beam search as one tensor program: prompt prefill, then exactly N_gen - 1 decode steps.

Semantics are HF transformers' beam search (`generate(num_beams=W, num_return_sequences=W,
max_new_tokens=N_gen, length_penalty=lp, early_stopping=False, do_sample=False)`), step for
step, with the control flow unrolled at build time so the whole search exports as one graph:

- K = max(2, 1 + n_stop) * W candidates are kept per step (HF's `beams_to_keep`).
- Step 0 takes the top K tokens of the prompt's last position (HF's other W - 1 initial beams
  start at -1e9 and can never win).
- Each decode step feeds the W running beams' last tokens through the model with the shared
  prompt K/V and per-beam suffix K/V. Candidate selection is two-level: per beam top K token
  ids on the logits, FP32 log-softmax values gathered at those ids plus the running scores,
  then a global top K over the W x K expansions: the same set as a global top K over W x V.
- Candidates ending in a stop token (or all candidates at the last step) become finished
  hypotheses when among the first W; the best W non-finished continue. HF's early-stop
  heuristic freezes the finished set once no running beam can beat it.
- Reordering by parent index touches only suffix K/V, tokens and scores; prompt K/V is never
  copied.

Inputs: tokens [L] int64, positions [L] int64, cu_seqlens [2] int32 (the prompt, packed).
Outputs: token_ids [W, N_gen] int64 (-1 after a stop token), scores [W] FP32 (best first),
finished [W] bool, beam_indices [W, N_gen] int64 (parent beam at each step, -1 after the end).
"""

from __future__ import annotations

import torch
from torch import nn

from boundgen.errors import ConfigError
from boundgen.model.qwen import QwenModel

NEG = -1.0e9  # HF's "impossible" score offset; kept identical so ties and sums match bit for bit


class BeamProgram(nn.Module):
    def __init__(self, model: QwenModel, width: int, steps: int, stop_token_ids: list[int] = (),
                 length_penalty: float = 0.0, min_new_tokens: int = 0):
        super().__init__()
        vocab = model.cfg.vocab_size
        self.model = model
        self.width, self.steps = width, steps
        self.keep = max(2, 1 + len(stop_token_ids)) * width
        if not 1 <= steps:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        if not 1 <= width or self.keep > vocab:
            raise ConfigError(f"width {width} keeps {self.keep} candidates per step, more than the vocabulary {vocab}")
        self.length_penalty = float(length_penalty)
        self.min_new_tokens = int(min_new_tokens)
        self.register_buffer("stop_token_ids", torch.tensor(list(stop_token_ids), dtype=torch.int64),
                             persistent=False)

    def _log_probs(self, hidden: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [M, H] -> (logits [M, V] model dtype, FP32 log-softmax [M, V]) with HF's processors."""
        logits = self.model.logits(hidden)
        logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        if step < self.min_new_tokens and self.stop_token_ids.numel():
            logp = logp.index_fill(1, self.stop_token_ids, float("-inf"))
            logits = logits.index_fill(1, self.stop_token_ids, float("-inf"))
        return logits, logp

    def _expand(self, logits, logp, running_scores):
        """Two-level top K: per beam top K ids, then global top K of the W x K sums.
        Returns candidate scores [K], token ids [K], parent beam [K] (sorted, best first)."""
        keep = self.keep
        _, row_ids = torch.topk(logits, keep, dim=-1)  # [W, K]
        sums = torch.gather(logp, 1, row_ids) + running_scores[:, None]  # [W, K] FP32
        scores, flat = torch.topk(sums.reshape(-1), keep)  # [K]
        parent = torch.div(flat, keep, rounding_mode="floor")
        tokens = row_ids.reshape(-1)[flat]
        return scores, tokens, parent

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor):
        model, W, N, K = self.model, self.width, self.steps, self.keep
        cfg = model.cfg
        device = tokens.device
        prompt_len = tokens.shape[0]
        hidden, (prefix_k, prefix_v) = model.prefill(tokens, positions, cu_seqlens, keep_kv=True)
        _, logp = self._log_probs(hidden[-1:], 0)  # [1, V]
        cand_scores, cand_tokens = torch.topk(logp[0], K)  # beam 0 only; its running score is 0
        cand_parent = torch.zeros(K, dtype=torch.int64, device=device)

        suffix_shape = (cfg.num_layers, W, max(N - 1, 1), cfg.num_kv_heads, cfg.head_dim)
        suffix_k = torch.zeros(suffix_shape, dtype=prefix_k.dtype, device=device)
        suffix_v = torch.zeros(suffix_shape, dtype=prefix_v.dtype, device=device)
        run_seq = torch.full((W, N), -1, dtype=torch.int64, device=device)
        run_bi = torch.full((W, N), -1, dtype=torch.int64, device=device)
        fin_seq = torch.full((W, N), -1, dtype=torch.int64, device=device)
        fin_bi = torch.full((W, N), -1, dtype=torch.int64, device=device)
        fin_scores = torch.full((W,), NEG, dtype=torch.float32, device=device)
        is_fin = torch.zeros(W, dtype=torch.bool, device=device)
        can_improve = torch.ones((), dtype=torch.bool, device=device)  # HF is_early_stop_heuristic_unsatisfied
        done = torch.zeros((), dtype=torch.bool, device=device)  # HF's loop has ended
        top_w = torch.arange(K, device=device) < W

        for step in range(N):
            # Candidate sequences: parent's tokens plus the new one.
            cand_seq = run_seq[cand_parent]
            cand_seq[:, step] = cand_tokens
            cand_bi = run_bi[cand_parent]
            cand_bi[:, step] = cand_parent
            if step == N - 1:
                hits = torch.ones(K, dtype=torch.bool, device=device)  # max length reached
            else:
                hits = torch.isin(cand_tokens, self.stop_token_ids)

            # Best W candidates that did not stop keep running.
            running = cand_scores + hits.to(torch.float32) * NEG
            sel = torch.topk(running, W).indices
            run_seq, run_bi, run_scores, kv_parent = cand_seq[sel], cand_bi[sel], running[sel], cand_parent[sel]

            # Stopped candidates among the first W join the finished hypotheses.
            just_fin = hits & top_w
            fin_cand = cand_scores / float((step + 1) ** self.length_penalty)
            fin_cand = fin_cand + (~can_improve).to(torch.float32) * NEG
            fin_cand = fin_cand + (~just_fin).to(torch.float32) * NEG
            merged = torch.cat((fin_scores, fin_cand))
            best = torch.topk(merged, W).indices
            fin_scores = torch.where(done, fin_scores, merged[best])
            fin_seq = torch.where(done, fin_seq, torch.cat((fin_seq, cand_seq))[best])
            fin_bi = torch.where(done, fin_bi, torch.cat((fin_bi, cand_bi))[best])
            is_fin = torch.where(done, is_fin, torch.cat((is_fin, just_fin))[best])

            # HF's stopping rule: stop when no running beam can beat the worst finished one,
            # or when every candidate stopped.
            best_running = run_scores[0] / float((step + 1) ** self.length_penalty)
            worst_fin = torch.where(is_fin, fin_scores.min(), torch.full_like(fin_scores, NEG))
            can_improve = can_improve & (best_running > worst_fin).any()
            done = done | ~can_improve | hits.all()
            if step == N - 1:
                break

            # Decode the running beams' last tokens; reorder only the suffix K/V by parent.
            if step > 0:
                suffix_k[:, :, :step] = suffix_k[:, kv_parent, :step]
                suffix_v[:, :, :step] = suffix_v[:, kv_parent, :step]
            positions_w = torch.full((W,), step, dtype=torch.int64, device=device) + prompt_len
            hidden_w = model.decode(run_seq[:, step], positions_w, prefix_k, prefix_v, suffix_k, suffix_v, step)
            logits, logp = self._log_probs(hidden_w, step + 1)
            cand_scores, cand_tokens, cand_parent = self._expand(logits, logp, run_scores)

        finished = torch.isin(fin_seq, self.stop_token_ids).any(dim=-1)
        return fin_seq, fin_scores, finished, fin_bi
