"""The peers: HF transformers on the same device, deployed the way a competent user would.

Two modes (`PeerOptions.mode`), one code path:
- "eager": the HF model as loaded (sdpa attention), no compilation.
- "compiled": the same calls through `torch.compile` (bench/peer_compiled.py says what is
  compiled, with which settings, and why beam search compiles only its decode step).

score (W1): the samples of one or more requests (`max_batch`) as one batch, softmax in FP32 over
the label tokens' logits at each sample's last token. Two paddings, measured against each other
by bench/peer_process.py:
- "bucket": right-padded to a multiple of `bucket` tokens, no attention mask. Causal attention
  never lets a token read a later one, so the padding tail changes no real token; sdpa then runs
  its causal (flash) kernel, and a request meets one of a handful of shapes. The hidden state at
  each sample's last real token goes through the LM head.
- "longest": left-padded to the longest sample, with the attention mask, position ids following
  the mask, `logits_to_keep=1` (what `generate` does); one shape per distinct longest sample.
beam (W2/W3): `generate(num_beams=W, num_return_sequences=W, max_new_tokens=N, min_new_tokens=N,
length_penalty=0.0, do_sample=False)`; the compiled mode adds a static cache. Several prompts of
one length go into one call as a batch. Beam scores are NaN unless `beam_scores=True` (asking
generate for them adds work).

bf16 on CUDA (float32 on CPU, for tests). One model call at a time: concurrent callers wait,
and bench/peer_batching.py puts up to `max_batch` waiting requests into one call. Timings of a
call ("pre" tokenise + copy in, "model" until the device is synchronised, "post" back to numpy or
text) are reported for each request in it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from boundgen.bench import peer_compiled
from boundgen.bench.tasks import bench_task
from boundgen.runtime.results import BeamResult, ScoreResult

MODES = ("eager", "compiled")
PADS = ("bucket", "longest")


@dataclass(frozen=True)
class PeerOptions:
    mode: str = "eager"
    pad: str = "bucket"  # score only: "bucket" | "longest" (module docstring)
    bucket: int = 64  # tokens; "bucket" pads every sample of a call to a multiple of this
    max_batch: int = 1  # requests per model call
    beam_scores: bool = False  # ask generate for sequences_scores
    compile_mode: str = "reduce-overhead"  # torch.compile mode in "compiled" mode

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"peer mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.pad not in PADS:
            raise ValueError(f"peer padding must be one of {', '.join(PADS)}, got {self.pad!r}")
        if self.mode == "compiled" and self.pad != "bucket":
            raise ValueError("the compiled peer pads to buckets: one compiled shape per distinct longest "
                             "sample would not finish compiling")
        if self.bucket <= 0 or self.max_batch <= 0:
            raise ValueError(f"bucket and max_batch must be positive, got {self.bucket} and {self.max_batch}")

    def describe(self, task: str) -> str:
        pad = (f", right-padded to {self.bucket}-token buckets without mask" if self.pad == "bucket"
               else ", left-padded to the longest sample with mask") if bench_task(task).peer_pads_samples else ""
        compiled = f", torch.compile {self.compile_mode}" if self.mode == "compiled" else ""
        return f"{self.mode}{compiled}{pad}, up to {self.max_batch} request(s) a call"


class HFPeer:
    def __init__(self, model_dir: str, *, device: str | None = None, dtype: str | None = None,
                 options: PeerOptions = PeerOptions()):
        import torch  # torch and transformers load here: the bench CLI imports this module without them
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        self.options = options
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or "<|endoftext|>"
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, self.dtype), attn_implementation="sdpa").to(self.device).eval()
        self._score_fn = self._score_last
        self._generate_kwargs: dict = {}
        if options.mode == "compiled":
            self._score_fn = peer_compiled.compile_score(self.model, self._score_last, options.compile_mode)
            peer_compiled.compile_decode(self.model, options.compile_mode)
            self._generate_kwargs = {"cache_implementation": "static"}
        self._lock = threading.Lock()

    def description(self, task: str) -> str:
        return (f"HF transformers {_version()} {type(self.model).__name__} {self.dtype} sdpa on {self.device}, "
                f"{self.options.describe(task)}")

    def with_options(self, **changes) -> None:
        """Change options that need no reload (padding, requests per call)."""
        new = replace(self.options, **changes)
        if new.mode != self.options.mode or new.compile_mode != self.options.compile_mode:
            raise ValueError("the peer's mode is fixed when it loads")
        self.options = new

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

    def padded_length(self, lengths: Sequence[int]) -> int:
        """Sequence length of a call whose samples have these token counts."""
        longest = max(lengths)
        if self.options.pad == "longest":
            return longest
        b = self.options.bucket
        return -(-longest // b) * b

    def _score_last(self, ids, last, labels):
        """Right-padded ids [B, L], each row's last real position [B] -> label probabilities [B, n_labels]."""
        torch = self.torch
        hidden = self.model.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, L, H]
        rows = torch.arange(ids.shape[0], device=ids.device)
        logits = self.model.lm_head(hidden[rows, last])  # [B, V]
        return torch.softmax(logits[:, labels].float(), dim=-1)

    def _score_longest(self, ids, mask, labels):
        """Left-padded ids and mask [B, L] -> label probabilities [B, n_labels]."""
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
        return self.torch.softmax(logits[:, -1, labels].float(), dim=-1)

    def score_batch(self, requests: Sequence[Sequence[str]], label_ids: Sequence[int]) -> list[ScoreResult]:
        """Every sample of `requests` in one model call; one result per request."""
        torch = self.torch
        with self._lock, torch.inference_mode():
            t0 = time.perf_counter()
            texts = [t for req in requests for t in req]
            encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            lengths = [len(e) for e in encoded]
            width, pad = self.padded_length(lengths), self.tokenizer.pad_token_id
            ids = np.full((len(texts), width), pad, dtype=np.int64)  # [B, L]
            labels = torch.tensor(list(label_ids), device=self.device)
            if self.options.pad == "bucket":
                for i, e in enumerate(encoded):
                    ids[i, : len(e)] = e
                last = torch.tensor([n - 1 for n in lengths], device=self.device)
                ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
                t1 = time.perf_counter()
                probs = self._score_fn(ids_t, last, labels)
            else:
                mask = np.zeros_like(ids)
                for i, e in enumerate(encoded):
                    ids[i, width - len(e):] = e
                    mask[i, width - len(e):] = 1
                ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
                mask_t = torch.from_numpy(mask).to(self.device, non_blocking=True)
                t1 = time.perf_counter()
                probs = self._score_longest(ids_t, mask_t, labels)
            self._sync()
            t2 = time.perf_counter()
            scores = probs.cpu().numpy()  # [B, n_labels]
            t3 = time.perf_counter()
        timings = {"pre": t1 - t0, "model": t2 - t1, "post": t3 - t2}
        out, start = [], 0
        for req in requests:
            out.append(ScoreResult(scores=scores[start: start + len(req)], label_token_ids=list(label_ids),
                                   timings=dict(timings)))
            start += len(req)
        return out

    def score(self, texts: Sequence[str], label_ids: Sequence[int]) -> ScoreResult:
        return self.score_batch([texts], label_ids)[0]

    def beam_batch(self, prompts: Sequence[str], width: int, steps: int) -> list[BeamResult]:
        """All prompts in one `generate` call (left-padded if their lengths differ); one result each."""
        torch = self.torch
        with self._lock, torch.inference_mode():
            t0 = time.perf_counter()
            enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
            ids = enc["input_ids"].to(self.device, non_blocking=True)
            mask = enc["attention_mask"].to(self.device, non_blocking=True)
            t1 = time.perf_counter()
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, num_beams=width, num_return_sequences=width,
                max_new_tokens=steps, min_new_tokens=steps, length_penalty=0.0, do_sample=False,
                early_stopping=False, pad_token_id=self.tokenizer.pad_token_id,
                return_dict_in_generate=True, output_scores=self.options.beam_scores, **self._generate_kwargs)
            self._sync()
            t2 = time.perf_counter()
            gen = out.sequences[:, ids.shape[1]:].to(torch.int32).cpu().numpy()  # [n * W, N_gen]
            scores = (out.sequences_scores.float().cpu().numpy() if self.options.beam_scores
                      else np.full(len(gen), np.nan, dtype=np.float32))
            texts = self.tokenizer.batch_decode(gen, skip_special_tokens=True)
            t3 = time.perf_counter()
        timings = {"pre": t1 - t0, "model": t2 - t1, "post": t3 - t2}
        return [BeamResult(token_ids=gen[k * width:(k + 1) * width], scores=scores[k * width:(k + 1) * width],
                           finished=np.zeros(width, dtype=bool), texts=texts[k * width:(k + 1) * width],
                           timings=dict(timings))
                for k in range(len(prompts))]

    def beam(self, text: str, width: int, steps: int) -> BeamResult:
        return self.beam_batch([text], width, steps)[0]

    def close(self):
        del self.model
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


def batch_call(peer: HFPeer, spec):
    """list of workload requests -> list of results, in one model call (bench.workloads.WorkloadSpec)."""
    return bench_task(spec.task).peer_batch(peer, spec)


def peer_call(peer: HFPeer, spec):
    """The load generator's callable for workload `spec`, one request a call."""
    run = batch_call(peer, spec)
    return lambda request: run([request])[0]


def _version() -> str:
    import transformers

    return transformers.__version__
