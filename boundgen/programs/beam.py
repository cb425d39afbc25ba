"""Fixed beam search as three tensor programs: prefill, one decode step (run N_gen - 1 times), finish.

Semantics are HF transformers' beam search (`generate(num_beams=W, num_return_sequences=W,
max_new_tokens=N_gen, length_penalty=lp, early_stopping=False, do_sample=False)`), step for
step:

- K = max(2, 1 + n_stop) * W candidates are kept per step (HF's `beams_to_keep`).
- Step 0 takes the top K tokens of each prompt's last position (HF's other W - 1 initial beams
  start at -1e9 and can never win).
- Each decode step feeds the W running beams' last tokens through the model with the shared
  prompt K/V and per-beam suffix K/V. Candidate selection is two-level: per beam top K token
  ids on the logits with their FP32 log-softmax values (ops/vocab_topk.py) plus the running scores,
  then a top K over the W x K expansions: the same set as a top K over W x V.
- Candidates ending in a stop token (or all candidates at the last step) become finished
  hypotheses when among the first W; the best W non-finished continue. HF's early-stop
  heuristic freezes the finished set once no running beam can beat it.
- Reordering by parent index touches only suffix K/V, tokens and scores; prompt K/V is never
  copied.

Stages. The search is split where the model runs, so that a build compiles the model twice
(prompt pass, decode step) however many steps there are, instead of unrolling N_gen passes
into one graph (which AOTInductor compiled too slowly: docs/build.md):

    prefill(tokens, positions, cu_seqlens[, *trie])          -> prefix_k, prefix_v, suffix_k, suffix_v, *state
    step(step, prefix_k, prefix_v, cu_seqlens[, *trie], suffix_k, suffix_v, *state) -> suffix_k, suffix_v, *state
    finish([*trie, ]*state)                                  -> token_ids, scores, finished, beam_indices[, item_ids]

(`state`: a BeamState, by name inside the stages, flattened where they meet; artifact/tensors.py.)

`step` is a [1] int64 tensor (0 .. N_gen - 2): one compiled step serves every step. The suffix
K/V keep their full capacity (N_gen - 1 slots); a step attends to slots [0, step] only. `run_stages`
(artifact/tensors.py) chains them; `BeamProgram.forward` is that chain over its own stages, and the compiled runner is
the same chain over the compiled packages (runtime/compiled.py). No data-dependent Python control
flow: each stage exports with T (and R) dynamic, and the chain replays as one CUDA graph.

R requests with the same W and N_gen run in one call: R prompts packed as in prefill, R x W
beams, one set of kernels per step. Every state has a leading request dim (as HF's own batched
`_beam_search`), and so does the "done" state (HF's loop ends for the whole batch; here a
request's finished set freezes on its own), so each request's rows equal running it alone.

Constrained search (`constraint`, a CatalogueConstraint: programs/constraint.py; None: none of
this runs, the program and its stages are the plain search). Step 0 masks the prompts' log-probs
to the tokens the trie's root allows; each decode step finds every running beam's trie node from
its tokens, masks the FP32 log-softmax of the whole vocabulary to the tokens that node allows
(-inf written in place, no [B, V] bias: the model's `ops.trie_mask`, ops/trie_mask.py, lowered
as the build chooses) and takes each beam's top K of that (torch.topk: a per-beam mask does not
fit vocab_topk's one [V] bias) where the build says `--lowering trie_topk=separate`; by default a
decode step instead takes each beam's top K over its node's allowed tokens only, their log-probs
gathered (ops/trie_topk.py: no [B, V] mask or top K; the same candidates). Finish returns a fifth
output, item_ids [R*W] int64; slots with no hypothesis (fewer than W items reachable) come back
as token ids -1, score -inf, item -1. The trie is the stages' input (TRIE tensors, after the
packed inputs; finish's first), so that a compiled artifact takes its catalogue when served;
`forward` passes the constraint's own arrays when it holds a catalogue and none are given.

Inputs: tokens [T] int64, positions [T] int64, cu_seqlens [R+1] int32 (the prompts, packed).
Outputs, rows r*W:(r+1)*W for request r, best first within each request:
token_ids [R*W, N_gen] int64 (-1 after a stop token), scores [R*W] FP32, finished [R*W] bool,
beam_indices [R*W, N_gen] int64 (parent beam within the request at each step, -1 after the end).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from boundgen.artifact.tensors import STAGES, TRIE, BeamState, Trie, run_stages
from boundgen.errors import ConfigError
from boundgen.model.qwen import QwenModel
from boundgen.ops import trie_topk
from boundgen.programs.constraint import CatalogueConstraint

NEG = -1.0e9  # HF's "impossible" score offset; kept identical so ties and sums match bit for bit


class BeamProgram(nn.Module):
    num_classes = 0  # no `probs` columns: candidates, not classes (ScoreProgram.num_classes)

    def __init__(self, model: QwenModel, width: int, steps: int, stop_token_ids: list[int] = (),
                 length_penalty: float = 0.0, min_new_tokens: int = 0, max_prompt_tokens: int | None = None,
                 constraint: CatalogueConstraint | None = None):
        """max_prompt_tokens: the bound the packer holds every prompt to, for attention lowerings
        that size their grid by it; None: no bound. constraint: a catalogue the candidates are
        restricted to (programs/constraint.py; "Constrained search" below); None: the plain search."""
        super().__init__()
        self.constraint = constraint
        vocab = model.cfg.vocab_size
        self.model = model
        self.width, self.steps = width, steps
        self.max_prompt_tokens = max_prompt_tokens
        self.keep = max(2, 1 + len(stop_token_ids)) * width
        if not 1 <= steps:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        if not 1 <= width or self.keep > vocab:
            raise ConfigError(f"width {width} keeps {self.keep} candidates per step, more than the vocabulary {vocab}")
        self.length_penalty = float(length_penalty)
        self.min_new_tokens = int(min_new_tokens)
        self.register_buffer("stop_token_ids", torch.tensor(list(stop_token_ids), dtype=torch.int64),
                             persistent=False)
        # HF divides by the Python float (generated ** lp); the same value per step, in FP32.
        self.register_buffer("penalty", torch.tensor([float((s + 1) ** self.length_penalty) for s in range(steps)],
                                                     dtype=torch.float32), persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, *trie: torch.Tensor):
        """trie: a constrained program's TRIE tensors (default: its catalogue's own)."""
        step_ids = [torch.full((1,), s, dtype=torch.int64, device=tokens.device) for s in range(self.steps - 1)]
        if self.constraint is not None and not trie:
            trie = self.constraint.own_trie()
            if trie is None:
                raise ValueError("this constrained program holds no catalogue: pass the trie tensors")
        return run_stages(self.prefill, self.step, self.finish, step_ids, tokens, positions, cu_seqlens, trie)

    def stages(self) -> dict[str, nn.Module]:
        """Each stage as a module of its own (what the build exports); they share this program's weights."""
        return {name: BeamStage(self, name) for name in STAGES}

    # -- stages ----------------------------------------------------------------------------------

    def prefill(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, *trie: torch.Tensor):
        """The prompts' pass and step 0's candidates; the empty search state."""
        model, W, N, K = self.model, self.width, self.steps, self.keep
        cfg, device = model.cfg, tokens.device
        R = cu_seqlens.shape[0] - 1
        hidden, (prefix_k, prefix_v) = model.prefill(tokens, positions, cu_seqlens, keep_kv=True,
                                                     max_seqlen=self.max_prompt_tokens)
        ends = cu_seqlens.to(torch.int64)[torch.arange(R, device=device) + 1]
        # Indexed, not sliced: a slice of cu_seqlens would make export guard R >= 2 (as the example).
        _, logp = self._log_probs(hidden[ends - 1], torch.zeros(1, dtype=torch.int64, device=device))  # [R, V]
        if self.constraint is not None:  # every prompt starts at the trie's root
            self.constraint.mask(model.ops.trie_mask, Trie(*trie), torch.zeros(R, dtype=torch.int64, device=device),
                                 logp, root=True)
        cand_scores, cand_tokens = torch.topk(logp, K, dim=-1)  # beam 0 only; its running score is 0
        suffix_shape = (cfg.num_layers, R * W, max(N - 1, 1), cfg.num_kv_heads, cfg.head_dim)
        seqs = [torch.full((R, W, N), -1, dtype=torch.int64, device=device) for _ in range(4)]
        state = BeamState(run_seq=seqs[0], run_bi=seqs[1], fin_seq=seqs[2], fin_bi=seqs[3],
                          fin_scores=torch.full((R, W), NEG, dtype=torch.float32, device=device),
                          is_fin=torch.zeros((R, W), dtype=torch.bool, device=device),
                          can_improve=torch.ones(R, dtype=torch.bool, device=device),
                          done=torch.zeros(R, dtype=torch.bool, device=device),
                          cand_scores=cand_scores, cand_tokens=cand_tokens,
                          cand_parent=torch.zeros((R, K), dtype=torch.int64, device=device))
        return (prefix_k, prefix_v,
                torch.zeros(suffix_shape, dtype=prefix_k.dtype, device=device),
                torch.zeros(suffix_shape, dtype=prefix_v.dtype, device=device),
                *state)

    def step(self, step: torch.Tensor, prefix_k, prefix_v, cu_seqlens, *rest):
        """Decode step `step` ([1] int64, 0 .. N_gen - 2): keep the best W candidates running,
        feed their last tokens through the model, expand them into the next candidates.
        rest: the TRIE tensors (constrained), suffix_k, suffix_v, the state."""
        trie, (suffix_k, suffix_v, *state) = self._trie(rest)
        model, W = self.model, self.width
        R = cu_seqlens.shape[0] - 1
        request = torch.arange(R, device=step.device)
        cu = cu_seqlens.to(torch.int64)
        prompt_lens = cu[request + 1] - cu[request]  # [R]
        state, run_scores, kv_parent = self._select(step, False, BeamState(*state))
        # Reorder only the suffix K/V by parent (all slots: those past `step` are never attended).
        rows = (kv_parent + request[:, None] * W).reshape(-1)  # [R*W] parent's row in the packed beams
        suffix_k, suffix_v = suffix_k[:, rows], suffix_v[:, rows]
        positions_w = (prompt_lens[:, None] + step).expand(-1, W).reshape(-1)  # [R*W]
        tokens_w = state.run_seq.index_select(2, step).reshape(-1)
        hidden_w = model.decode(tokens_w, positions_w, prefix_k, prefix_v, suffix_k, suffix_v, step, cu_seqlens, W)
        logits = model.logits(hidden_w)  # [R*W, V]
        if self.constraint is None:
            row_logp, row_ids = model.ops.vocab_topk(logits, self._barred(step + 1, logits), self.keep)  # [R*W, K]
        else:
            row_logp, row_ids = self._constrained_topk(trie, logits, state.run_seq.reshape(R * W, -1), step)
        scores, tokens, parent = self._expand(row_logp.reshape(-1, W, self.keep), row_ids.reshape(-1, W, self.keep),
                                              run_scores)
        state = state._replace(cand_scores=scores, cand_tokens=tokens, cand_parent=parent)
        return (suffix_k, suffix_v, *state)

    def finish(self, *rest):
        """The last step's selection (every candidate ends: max length) -> the outputs.
        rest: the TRIE tensors (constrained), the state."""
        trie, state = self._trie(rest)
        N = self.steps
        last = torch.full((1,), N - 1, dtype=torch.int64, device=state[0].device)
        state, _, _ = self._select(last, True, BeamState(*state))
        finished = torch.isin(state.fin_seq, self.stop_token_ids).any(dim=-1)  # [R, W]
        if self.constraint is not None:
            return self._constrained_outputs(trie, state, finished)
        return (state.fin_seq.reshape(-1, N), state.fin_scores.reshape(-1), finished.reshape(-1),
                state.fin_bi.reshape(-1, N))

    # -- pieces ----------------------------------------------------------------------------------

    def _trie(self, inputs: tuple) -> tuple[Trie | None, tuple]:
        """A stage's inputs past its own -> (the trie, when constrained; the rest)."""
        if self.constraint is None:
            return None, inputs
        return Trie(*inputs[:len(TRIE)]), inputs[len(TRIE):]

    def _select(self, step: torch.Tensor, last: bool, state: BeamState):
        """Step `step`'s candidates -> running beams and finished hypotheses (HF's per-step update).
        Returns the state with the new running beams and finished set (candidates as they were),
        the running beams' scores [R, W] and their parent beams [R, W] (to reorder the suffix K/V)."""
        W, K = self.width, self.keep
        run_seq, run_bi, fin_seq, fin_bi, fin_scores, is_fin, can_improve, done = state[:8]
        cand_scores, cand_tokens, cand_parent = state.cand_scores, state.cand_tokens, state.cand_parent
        device = cand_scores.device
        # Candidate sequences: parent's tokens plus the new one.
        cand_seq = _gather_beams(run_seq, cand_parent).index_copy(2, step, cand_tokens[:, :, None])  # [R, K, N]
        cand_bi = _gather_beams(run_bi, cand_parent).index_copy(2, step, cand_parent[:, :, None])
        if last:
            hits = torch.ones_like(cand_tokens, dtype=torch.bool)  # max length reached
        else:
            hits = torch.isin(cand_tokens, self.stop_token_ids)

        # Best W candidates that did not stop keep running.
        running = cand_scores + hits.to(torch.float32) * NEG
        sel = torch.topk(running, W, dim=-1).indices  # [R, W]
        run_seq, run_bi = _gather_beams(cand_seq, sel), _gather_beams(cand_bi, sel)
        run_scores, kv_parent = _gather_beams(running, sel), _gather_beams(cand_parent, sel)

        # Stopped candidates among the first W join the finished hypotheses.
        penalty = self.penalty[step]  # [1]
        just_fin = hits & (torch.arange(K, device=device) < W)
        fin_cand = cand_scores / penalty
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
        best_running = run_scores[:, :1] / penalty  # [R, 1]
        worst_fin = torch.where(is_fin, fin_scores.min(dim=1, keepdim=True).values,
                                torch.full_like(fin_scores, NEG))
        can_improve = can_improve & (best_running > worst_fin).any(dim=1)
        done = done | ~can_improve | hits.all(dim=1)
        state = state._replace(run_seq=run_seq, run_bi=run_bi, fin_seq=fin_seq, fin_bi=fin_bi, fin_scores=fin_scores,
                               is_fin=is_fin, can_improve=can_improve, done=done)
        return state, run_scores, kv_parent

    def _log_probs(self, hidden: torch.Tensor, generated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [M, H] -> (logits [M, V] model dtype, FP32 log-softmax [M, V]) with HF's processors.
        generated: [1] int64, tokens generated before these (stop tokens are barred below min_new_tokens)."""
        logits = self.model.logits(hidden)
        logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        barred = self._barred(generated, logits)
        if barred is None:
            return logits, logp
        return logits + barred.to(logits.dtype), logp + barred

    def _barred(self, generated: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        """[V] FP32 added to the log-probs (HF's min-new-tokens processor): -inf on the stop tokens
        while fewer than min_new_tokens were generated, else 0 (adding it changes nothing). None
        when this program bars no token (no min_new_tokens or no stop tokens): nothing to add."""
        if not (self.min_new_tokens and self.stop_token_ids.numel()):
            return None
        barred = torch.zeros(logits.shape[-1], dtype=torch.float32, device=logits.device)
        barred = barred.index_fill(0, self.stop_token_ids, float("-inf"))
        return torch.where(generated < self.min_new_tokens, barred, torch.zeros_like(barred))

    def _constrained_topk(self, trie: Trie, logits: torch.Tensor, run_seq: torch.Tensor, step: torch.Tensor):
        """Each running beam's top K tokens among those its trie node allows: logits [R*W, V],
        run_seq [R*W, N] -> (logp [R*W, K] FP32, ids [R*W, K] int64). The log-probs are the
        unmasked model's (log-softmax over the whole vocabulary), -inf on disallowed tokens: HF's
        scores under prefix_allowed_tokens_fn. Ranked by those FP32 log-probs (as HF ranks)."""
        ops = self.model.ops  # the fused op (over each beam's allowed tokens only), else the mask and a top K
        select = ops.trie_topk or functools.partial(trie_topk.separate, mask=ops.trie_mask)
        return self.constraint.topk(select, trie, self.constraint.nodes(trie, run_seq), logits,
                                    self._barred(step + 1, logits), self.keep)

    def _constrained_outputs(self, trie: Trie, state: BeamState, finished: torch.Tensor):
        """The outputs of a constrained search, with item_ids [R*W] int64 last. Slots without a
        hypothesis (fewer than W items reachable) get token ids -1, score -inf, item -1."""
        N = self.steps
        seq = state.fin_seq.reshape(-1, N)
        # A slot holds an item only above NEG / 2: below, a beam carried on past its stop token for
        # want of W live ones (HF's -1e9 rows), not a hypothesis.
        present = state.is_fin.reshape(-1) & (state.fin_scores.reshape(-1) > NEG / 2)
        scores = torch.where(present, state.fin_scores.reshape(-1), torch.full_like(state.fin_scores.reshape(-1),
                                                                                    float("-inf")))
        seq = torch.where(present[:, None], seq, torch.full_like(seq, -1))
        items = torch.where(present, self.constraint.items(trie, seq), torch.full_like(seq[:, 0], -1))
        return seq, scores, finished.reshape(-1) & present, state.fin_bi.reshape(-1, N), items

    def _expand(self, row_logp, row_ids, running_scores):
        """Two-level top K per request: each beam's top K tokens (ops.vocab_topk: ids and FP32
        log-probs, [R, W, K]), then the top K of the W x K sums with the running scores [R, W].
        Returns candidate scores [R, K], token ids [R, K], parent beam within the request [R, K]
        (sorted, best first)."""
        keep, width = self.keep, self.width
        sums = row_logp + running_scores[:, :, None]  # [R, W, K] FP32
        scores, flat = torch.topk(sums.reshape(-1, width * keep), keep, dim=-1)  # [R, K]
        parent = torch.div(flat, keep, rounding_mode="floor")
        tokens = torch.gather(row_ids.reshape(-1, width * keep), 1, flat)
        return scores, tokens, parent


class BeamStage(nn.Module):
    """One stage of a BeamProgram as a module: `forward` is the program's stage method."""

    def __init__(self, program: BeamProgram, name: str):
        super().__init__()
        self.program = program
        self.stage = name

    def forward(self, *inputs):
        return getattr(self.program, self.stage)(*inputs)


def _gather_beams(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor [R, B, ...], index [R, S] -> [R, S, ...]: rows of each request by beam index."""
    trailing = tensor.shape[2:]
    index = index.reshape(index.shape + (1,) * len(trailing)).expand(*index.shape, *trailing)
    return torch.gather(tensor, 1, index)  # not take_along_dim: its broadcast pins R in export
