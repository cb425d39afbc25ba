"""The node kinds of boundgen's two DAGs.

score:  texts -> [tokenize] -> tokens, positions, cu_seqlens -> [model] -> probs -> [encode_scores] -> result
beam:   text  -> [tokenize] -> tokens, positions, cu_seqlens -> [model] -> token_ids, scores, finished,
        beam_indices -> [encode_beams] -> result

CPU nodes check request bounds and do text work; the model node calls a runner (the AOTI
package, or the eager program) on the context's stream, with a bounded number of executors.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from boundgen.errors import InvalidInput
from boundgen.runtime.dag import Node, NodeSpec
from boundgen.runtime.graphs import bucket_size, pad_batch
from boundgen.runtime.results import BeamResult, ScoreResult

PACKED = ("tokens", "positions", "cu_seqlens")
BEAM_OUTPUTS = ("token_ids", "scores", "finished", "beam_indices")


class TokenizeNode(Node):
    """Check request bounds, apply the template, tokenize into the context's packed buffers.

    With `token_bucket`, batches are padded (see runtime/graphs.py) so that CUDA graphs are
    reused: tokens up to a multiple of the bucket (score: a filler sequence, sequences up to
    max_samples + 1; beam: a tail of no request, the requests as they are).
    """

    def __init__(self, tokenizer, spec, input_name: str, token_bucket: int = 0):
        self.tokenizer, self.bounds = tokenizer, spec
        self.spec = NodeSpec("tokenize", "cpu", (input_name,), PACKED + ("num_samples",))
        self.single = input_name == "text"
        self.token_bucket = token_bucket

    def run(self, ctx, **inputs):
        texts = [inputs["text"]] if self.single else list(inputs["texts"])
        return self.stage(ctx, self.encode(texts))

    def encode(self, texts: list[str]):
        """Check the request against the bounds and tokenize it (CPU only, no context needed)."""
        b = self.bounds
        if not texts:
            raise InvalidInput("the request has no samples")
        if len(texts) > b.max_samples:
            raise InvalidInput(f"the request has {len(texts)} samples; this model accepts at most {b.max_samples}")
        if self.single:  # errors then speak of "the prompt"
            batch = self.tokenizer.encode_one(texts[0], b.max_tokens_per_sample, template=b.template)
        else:
            batch = self.tokenizer.encode_packed(texts, max_tokens_per_sample=b.max_tokens_per_sample,
                                                 template=b.template)
        total = int(batch.tokens.shape[0])
        if total > b.max_total_tokens:
            raise InvalidInput(f"the request has {total} tokens in all; this model accepts at most {b.max_total_tokens}")
        return batch

    def stage(self, ctx, batch):
        """Pad for CUDA graphs if configured and write the batch into the context's buffers."""
        tokens, positions, cu = batch.tokens, batch.positions, batch.cu_seqlens
        shape = self.padded_shape(int(tokens.shape[0]), int(cu.shape[0]) - 1)
        if shape is not None:
            tokens, positions, cu = pad_batch(tokens, positions, cu, *shape)
        tokens, positions, cu = ctx.stage(tokens, positions, cu)
        return {"tokens": tokens, "positions": positions, "cu_seqlens": cu, "num_samples": batch.num_samples}

    def padded_shape(self, num_tokens: int, num_sequences: int) -> tuple[int, int] | None:
        """(tokens, sequences) a batch is padded to for CUDA graphs; None: not padded."""
        if not self.token_bucket:
            return None
        b = self.bounds
        tokens = bucket_size(num_tokens, self.token_bucket, b.call_max_tokens)
        return (tokens, b.max_samples + 1) if not self.single else (tokens, num_sequences)

    def warm_batches(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """One synthetic padded batch per shape that `stage` can produce (CPU tensors), to capture
        every CUDA graph at warm-up: each has one-token sequences, then the padding."""
        if not self.token_bucket:
            return []
        b, bucket = self.bounds, self.token_bucket
        # (tokens, one-token sequences before the padding, sequences in all)
        if not self.single:
            shapes = {(t, 1, b.max_samples + 1) for t in _multiples(bucket, b.call_max_tokens)}
        else:
            shapes = set()
            for requests in range(1, b.max_requests + 1):
                most = bucket_size(requests * b.max_prompt_tokens, bucket, b.call_max_tokens)
                shapes |= {(t, requests, requests) for t in _multiples(bucket, most) if t >= requests}
        batches = []
        for total, real, sequences in sorted(shapes):
            ids = torch.zeros(real, dtype=torch.int64)
            batches.append(pad_batch(ids, ids, torch.arange(real + 1, dtype=torch.int32), total, sequences))
        return batches


class ModelNode(Node):
    """Calls the compiled (or eager) program; at most `executors` calls run at once."""

    def __init__(self, runner, outputs: tuple[str, ...], executors: int = 1):
        self.runner = runner
        self.spec = NodeSpec("model", "model", PACKED, outputs)
        self._slots = threading.Semaphore(max(1, executors))

    def run(self, ctx, tokens, positions, cu_seqlens):
        with self._slots, ctx.stream_scope():
            out = self.runner(tokens, positions, cu_seqlens)
        return dict(zip(self.spec.outputs, out))


def to_host(ctx, *tensors):
    """Copy results to the CPU; the only synchronisation point of a request."""
    with ctx.stream_scope():
        host = [t.to("cpu", non_blocking=False) for t in tensors]
    return [h.numpy() for h in host]


class ScoreEncodeNode(Node):
    def __init__(self, label_token_ids, topk: bool):
        self.label_token_ids = [int(i) for i in label_token_ids]
        inputs = ("num_samples", "probs") + (("topk_ids", "topk_probs") if topk else ())
        self.spec = NodeSpec("encode_scores", "cpu", inputs, ("result",))

    def run(self, ctx, num_samples, probs, topk_ids=None, topk_probs=None):
        outputs = [probs] + ([topk_ids, topk_probs] if topk_ids is not None else [])
        return {"result": self.encode(*to_host(ctx, *[t[:num_samples] for t in outputs]))}  # padding dropped

    def encode(self, probs: np.ndarray, topk_ids: np.ndarray | None = None,
               topk_probs: np.ndarray | None = None) -> ScoreResult:
        """One request's rows (host arrays) -> result."""
        result = ScoreResult(scores=probs.astype(np.float32, copy=False), label_token_ids=self.label_token_ids)
        if topk_ids is not None:
            result.topk_ids, result.topk_probs = topk_ids.astype(np.int32), topk_probs.astype(np.float32)
        return result


class BeamEncodeNode(Node):
    def __init__(self, tokenizer, stop_token_ids, width: int):
        self.tokenizer, self.width = tokenizer, width
        self.stop = set(int(t) for t in stop_token_ids)
        self.spec = NodeSpec("encode_beams", "cpu", BEAM_OUTPUTS, ("result",))

    def run(self, ctx, token_ids, scores, finished, beam_indices):
        rows = slice(0, self.width)  # the request's beams
        return {"result": self.encode(*to_host(ctx, token_ids[rows], scores[rows], finished[rows]))}

    def encode(self, ids: np.ndarray, scores: np.ndarray, finished: np.ndarray) -> BeamResult:
        """One request's candidates (host arrays) -> result with decoded texts."""
        texts = self.tokenizer.decode_batch(
            [[int(t) for t in row if t >= 0 and int(t) not in self.stop] for row in ids])
        return BeamResult(token_ids=ids.astype(np.int32), scores=scores.astype(np.float32, copy=False),
                          finished=finished.astype(bool), texts=texts)


def score_nodes(tokenizer, spec, runner, executors: int = 1, token_bucket: int = 0):
    outputs = ("probs",) + (("topk_ids", "topk_probs") if spec.topk else ())
    return ("texts",), [TokenizeNode(tokenizer, spec, "texts", token_bucket), ModelNode(runner, outputs, executors),
                        ScoreEncodeNode(spec.label_token_ids, bool(spec.topk))], ("result",)


def beam_nodes(tokenizer, spec, runner, executors: int = 1, token_bucket: int = 0):
    return ("text",), [TokenizeNode(tokenizer, spec, "text", token_bucket), ModelNode(runner, BEAM_OUTPUTS, executors),
                       BeamEncodeNode(tokenizer, spec.stop_token_ids, spec.width)], ("result",)


def _multiples(step: int, most: int) -> list[int]:
    """step, 2 step, ... up to `most`, and `most` itself (bucket_size caps there)."""
    return sorted(set(range(step, most + 1, step)) | {most})
