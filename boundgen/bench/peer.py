"""The peer: HF transformers on the same device, driven by the same load generator.

Same method as the numbers in GPU.md:
- score: the request's samples as one left-padded batch, `logits_to_keep=1`, softmax (FP32)
  over the label tokens' logits at the last position. Position ids follow the attention mask,
  so left padding does not shift RoPE (what `generate` does too).
- beam: `generate(num_beams=W, num_return_sequences=W, max_new_tokens=N, min_new_tokens=N,
  length_penalty=0.0, do_sample=False)`.
bf16 and sdpa attention on CUDA (float32 on CPU, for tests). One request at a time on the
device, as a plain HF deployment runs: concurrent callers wait on a lock, and that wait shows
as queue time. Timings: "pre" tokenise + copy in, "model" forward / generate until the device
is synchronised, "post" softmax or decode back to numpy / text. Beam scores are NaN unless
`beam_scores=True` (asking generate for them adds work GPU.md's peer numbers did not include).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import numpy as np

from boundgen.runtime.results import BeamResult, ScoreResult


class HFPeer:
    def __init__(self, model_dir: str, *, device: str | None = None, dtype: str | None = None,
                 beam_scores: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        attn = "sdpa"
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or "<|endoftext|>"
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), attn_implementation=attn).to(self.device).eval()
        self.description = f"HF transformers {_version()} {type(self.model).__name__} {dtype} {attn} on {self.device}"
        self.beam_scores = beam_scores  # ask generate for sequences_scores (off: as GPU.md measured)
        self._lock = threading.Lock()

    def _sync(self):
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def label_token_ids(self, labels: Sequence[str]) -> list[int]:
        ids = []
        for label in labels:
            tok = self.tokenizer.encode(label, add_special_tokens=False)
            if len(tok) != 1:
                raise ValueError(f"label {label!r} is {len(tok)} tokens under the peer's tokenizer; expected one")
            ids.append(tok[0])
        return ids

    def _encode(self, texts: Sequence[str]):
        enc = self.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].to(self.device, non_blocking=True)
        mask = enc["attention_mask"].to(self.device, non_blocking=True)
        return ids, mask

    def score(self, texts: Sequence[str], label_ids: Sequence[int]) -> ScoreResult:
        torch = self.torch
        with self._lock, torch.inference_mode():
            t0 = time.perf_counter()
            ids, mask = self._encode(texts)  # [B, L_max] left-padded
            positions = (mask.cumsum(-1) - 1).clamp_min(0)
            labels = torch.tensor(list(label_ids), device=self.device)
            t1 = time.perf_counter()
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
            probs = torch.softmax(logits[:, -1, labels].float(), dim=-1)  # [B, L]
            self._sync()
            t2 = time.perf_counter()
            scores = probs.cpu().numpy()
            t3 = time.perf_counter()
        return ScoreResult(scores=scores, label_token_ids=list(label_ids),
                           timings={"pre": t1 - t0, "model": t2 - t1, "post": t3 - t2})

    def beam(self, text: str, width: int, steps: int) -> BeamResult:
        torch = self.torch
        with self._lock, torch.inference_mode():
            t0 = time.perf_counter()
            ids, mask = self._encode([text])
            t1 = time.perf_counter()
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, num_beams=width, num_return_sequences=width,
                max_new_tokens=steps, min_new_tokens=steps, length_penalty=0.0, do_sample=False,
                early_stopping=False, pad_token_id=self.tokenizer.pad_token_id,
                return_dict_in_generate=True, output_scores=self.beam_scores)
            self._sync()
            t2 = time.perf_counter()
            gen = out.sequences[:, ids.shape[1]:].to(torch.int32).cpu().numpy()  # [W, N_gen]
            scores = (out.sequences_scores.float().cpu().numpy() if self.beam_scores
                      else np.full(len(gen), np.nan, dtype=np.float32))
            texts = self.tokenizer.batch_decode(gen, skip_special_tokens=True)
            t3 = time.perf_counter()
        return BeamResult(token_ids=gen, scores=scores, finished=np.zeros(len(gen), dtype=bool), texts=texts,
                          timings={"pre": t1 - t0, "model": t2 - t1, "post": t3 - t2})

    def close(self):
        del self.model
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


def peer_call(peer: HFPeer, spec):
    """The load generator's callable for workload `spec` (bench.workloads.WorkloadSpec)."""
    if spec.task == "score":
        label_ids = peer.label_token_ids(spec.labels)
        return lambda request: peer.score(request.texts, label_ids)
    return lambda request: peer.beam(request.texts[0], spec.width, spec.steps)


def _version() -> str:
    import transformers

    return transformers.__version__
