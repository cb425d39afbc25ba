"""Fixed beam search as one tensor program: prompt prefill, then exactly N_gen - 1 decode steps.

Semantics are HF transformers' beam search (`generate(num_beams=W, num_return_sequences=W,
max_new_tokens=N_gen, length_penalty=lp, early_stopping=False, do_sample=False)`), step for
step, with the control flow unrolled at build time so the whole search exports as one graph:

- K = max(2, 1 + n_stop) * W candidates are kept per step (HF's `beams_to_keep`).
- Step 0 takes the top K tokens of each prompt's last position (HF's other W - 1 initial beams
  start at -1e9 and can never win).
- Each decode step feeds the W running beams' last tokens through the model with the shared
  prompt K/V and per-beam suffix K/V. Candidate selection is two-level: per beam top K token
  ids on the logits, FP32 log-softmax values gathered at those ids plus the running scores,
  then a top K over the W x K expansions: the same set as a top K over W x V.
- Candidates ending in a stop token (or all candidates at the last step) become finished
  hypotheses when among the first W; the best W non-finished continue. HF's early-stop
  heuristic freezes the finished set once no running beam can beat it.
- Reordering by parent index touches only suffix K/V, tokens and scores; prompt K/V is never
  copied.

R requests with the same W and N_gen run in one call: R prompts packed as in prefill, R x W
beams, one set of kernels per step. Every state above has a leading request dim (as HF's own
batched `_beam_search`), and so does the "done" state (HF's loop ends for the whole batch;
here a request's finished set freezes on its own), so each request's rows equal running it
alone. No data-dependent Python control flow: it exports with R and T dynamic and replays
as a CUDA graph.

Inputs: tokens [T] int64, positions [T] int64, cu_seqlens [R+1] int32 (the prompts, packed).
Outputs, rows r*W:(r+1)*W for request r, best first within each request:
token_ids [R*W, N_gen] int64 (-1 after a stop token), scores [R*W] FP32, finished [R*W] bool,
beam_indices [R*W, N_gen] int64 (parent beam within the request at each step, -1 after the end).
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
        """Two-level top K per request: per beam top K ids, then top K of the W x K sums.
        logits/logp [R, W, V], running_scores [R, W]. Returns candidate scores [R, K], token ids
        [R, K], parent beam within the request [R, K] (sorted, best first)."""
        keep, width = self.keep, self.width
        _, row_ids = torch.topk(logits, keep, dim=-1)  # [R, W, K]
        sums = torch.gather(logp, 2, row_ids) + running_scores[:, :, None]  # [R, W, K] FP32
        scores, flat = torch.topk(sums.reshape(-1, width * keep), keep, dim=-1)  # [R, K]
        parent = torch.div(flat, keep, rounding_mode="floor")
        tokens = torch.gather(row_ids.reshape(-1, width * keep), 1, flat)
        return scores, tokens, parent

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor):
        model, W, N, K = self.model, self.width, self.steps, self.keep
        cfg = model.cfg
        device = tokens.device
        R = cu_seqlens.shape[0] - 1
        hidden, (prefix_k, prefix_v) = model.prefill(tokens, positions, cu_seqlens, keep_kv=True)
        request = torch.arange(R, device=device)  # [R]
        # Indexed, not sliced: a slice of cu_seqlens would make export guard R >= 2 (as the example).
        starts, ends = cu_seqlens.to(torch.int64)[request], cu_seqlens.to(torch.int64)[request + 1]
        prompt_lens = ends - starts  # [R]
        _, logp = self._log_probs(hidden[ends - 1], 0)  # [R, V]
        cand_scores, cand_tokens = torch.topk(logp, K, dim=-1)  # beam 0 only; its running score is 0
        cand_parent = torch.zeros((R, K), dtype=torch.int64, device=device)

        suffix_shape = (cfg.num_layers, R * W, max(N - 1, 1), cfg.num_kv_heads, cfg.head_dim)
        suffix_k = torch.zeros(suffix_shape, dtype=prefix_k.dtype, device=device)
        suffix_v = torch.zeros(suffix_shape, dtype=prefix_v.dtype, device=device)
        run_seq = torch.full((R, W, N), -1, dtype=torch.int64, device=device)
        run_bi = torch.full((R, W, N), -1, dtype=torch.int64, device=device)
        fin_seq = torch.full((R, W, N), -1, dtype=torch.int64, device=device)
        fin_bi = torch.full((R, W, N), -1, dtype=torch.int64, device=device)
        fin_scores = torch.full((R, W), NEG, dtype=torch.float32, device=device)
        is_fin = torch.zeros((R, W), dtype=torch.bool, device=device)
        can_improve = torch.ones(R, dtype=torch.bool, device=device)  # HF is_early_stop_heuristic_unsatisfied
        done = torch.zeros(R, dtype=torch.bool, device=device)  # HF's loop has ended (for this request)
        top_w = torch.arange(K, device=device) < W
        first_beam = request[:, None] * W  # [R, 1] row of each request's beam 0

        for step in range(N):
            # Candidate sequences: parent's tokens plus the new one.
            cand_seq = _gather_beams(run_seq, cand_parent)  # [R, K, N]
            cand_seq[:, :, step] = cand_tokens
            cand_bi = _gather_beams(run_bi, cand_parent)
            cand_bi[:, :, step] = cand_parent
            if step == N - 1:
                hits = torch.ones((R, K), dtype=torch.bool, device=device)  # max length reached
            else:
                hits = torch.isin(cand_tokens, self.stop_token_ids)

            # Best W candidates that did not stop keep running.
            running = cand_scores + hits.to(torch.float32) * NEG
            sel = torch.topk(running, W, dim=-1).indices  # [R, W]
            run_seq, run_bi = _gather_beams(cand_seq, sel), _gather_beams(cand_bi, sel)
            run_scores, kv_parent = _gather_beams(running, sel), _gather_beams(cand_parent, sel)

            # Stopped candidates among the first W join the finished hypotheses.
            just_fin = hits & top_w
            fin_cand = cand_scores / float((step + 1) ** self.length_penalty)
            fin_cand = fin_cand + (~can_improve[:, None]).to(torch.float32) * NEG
            fin_cand = fin_cand + (~just_fin).to(torch.float32) * NEG
            merged = torch.cat((fin_scores, fin_cand), dim=1)  # [R, W + K]
            best = torch.topk(merged, W, dim=-1).indices
            frozen = done[:, None]
            fin_scores = torch.where(frozen, fin_scores, _gather_beams(merged, best))
            fin_seq = torch.where(frozen[..., None], fin_seq, _gather_beams(torch.cat((fin_seq, cand_seq), 1), best))
            fin_bi = torch.where(frozen[..., None], fin_bi, _gather_beams(torch.cat((fin_bi, cand_bi), 1), best))
            is_fin = torch.where(frozen, is_fin, _gather_beams(torch.cat((is_fin, just_fin), 1), best))

            # HF's stopping rule, per request: stop when no running beam can beat the worst
            # finished one, or when every candidate stopped.
            best_running = run_scores[:, :1] / float((step + 1) ** self.length_penalty)  # [R, 1]
            worst_fin = torch.where(is_fin, fin_scores.min(dim=1, keepdim=True).values,
                                    torch.full_like(fin_scores, NEG))
            can_improve = can_improve & (best_running > worst_fin).any(dim=1)
            done = done | ~can_improve | hits.all(dim=1)
            if step == N - 1:
                break

            # Decode the running beams' last tokens; reorder only the suffix K/V by parent.
            if step > 0:
                rows = (kv_parent + first_beam).reshape(-1)  # [R*W] parent's row in the packed beams
                suffix_k[:, :, :step] = suffix_k[:, rows, :step]
                suffix_v[:, :, :step] = suffix_v[:, rows, :step]
            positions_w = (prompt_lens[:, None] + step).expand(-1, W).reshape(-1)  # [R*W]
            hidden_w = model.decode(run_seq[:, :, step].reshape(-1), positions_w, prefix_k, prefix_v,
                                    suffix_k, suffix_v, step, cu_seqlens, W)
            logits, logp = self._log_probs(hidden_w, step + 1)  # [R*W, V]
            vocab = logits.shape[-1]
            cand_scores, cand_tokens, cand_parent = self._expand(
                logits.reshape(-1, W, vocab), logp.reshape(-1, W, vocab), run_scores)

        finished = torch.isin(fin_seq, self.stop_token_ids).any(dim=-1)  # [R, W]
        return (fin_seq.reshape(-1, N), fin_scores.reshape(-1), finished.reshape(-1),
                fin_bi.reshape(-1, N))


def _gather_beams(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor [R, B, ...], index [R, S] -> [R, S, ...]: rows of each request by beam index."""
    trailing = tensor.shape[2:]
    index = index.reshape(index.shape + (1,) * len(trailing)).expand(*index.shape, *trailing)
    return torch.gather(tensor, 1, index)  # not take_along_dim: its broadcast pins R in export
