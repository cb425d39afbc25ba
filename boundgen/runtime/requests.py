"""A request's way in and out of a program call: bounds, tokenizing, packing, padding, encoding.

    texts -> RequestPacker.encode (CPU: bounds, template, tokens)   -> PackedBatch
    PackedBatch x R -> concat_packed -> RequestPacker.stage (pad for CUDA graphs, write into a
                       request context's buffers)                  -> tokens, positions, cu_seqlens
    program outputs -> to_host -> each request's rows -> ScoreResultBuilder / BeamResultBuilder -> result

The engine (runtime/local_engine.py) runs these in that order for every request, batched or not.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from boundgen.artifact.tasks import task_of
from boundgen.errors import InvalidInput
from boundgen.runtime.graphs import bucket_size, pad_batch
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.text.tokenizer import PackedBatch


class RequestPacker:
    """Check request bounds, apply the template, tokenize; stage packed batches into contexts.

    With `token_bucket`, batches are padded (see runtime/graphs.py) so that CUDA graphs are
    reused: tokens up to a multiple of the bucket (score: a filler sequence, sequences up to
    max_samples + 1; beam: a tail of no request, the requests as they are).
    """

    def __init__(self, tokenizer, spec, token_bucket: int = 0):
        self.tokenizer, self.bounds = tokenizer, spec
        self.one_prompt = task_of(spec).one_prompt  # a request is one prompt, not N samples
        self.token_bucket = token_bucket

    def encode(self, texts: list[str]) -> PackedBatch:
        """Check the request against the bounds and tokenize it (CPU only, no context needed)."""
        b = self.bounds
        if not texts:
            raise InvalidInput("the request has no samples")
        if len(texts) > b.max_samples:
            raise InvalidInput(f"the request has {len(texts)} samples; this model accepts at most {b.max_samples}")
        if self.one_prompt:
            batch = self.tokenizer.encode_one(texts[0], b.max_tokens_per_sample, template=b.template)
        else:
            batch = self.tokenizer.encode_packed(texts, max_tokens_per_sample=b.max_tokens_per_sample,
                                                 template=b.template)
        total = int(batch.tokens.shape[0])
        if total > b.max_total_tokens:
            raise InvalidInput(f"the request has {total} tokens in all; this model accepts at most {b.max_total_tokens}")
        return batch

    def pack_ids(self, samples: list) -> PackedBatch:
        """Check samples given as token ids against the bounds and the vocabulary, and pack them
        (no template: the ids are the model's input, as SGLang's pre-tokenized /v1/score sends them)."""
        b = self.bounds
        if isinstance(samples, np.ndarray):  # [B, n] ids: the lists they stand for
            samples = samples.tolist()
        if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence):
            raise InvalidInput(f"score_ids takes a list of samples, each a list of token ids; got {type(samples).__name__}")
        if not samples:
            raise InvalidInput("the request has no samples")
        if len(samples) > b.max_samples:
            raise InvalidInput(f"the request has {len(samples)} samples; this model accepts at most {b.max_samples}")
        return self.tokenizer.pack_ids(samples, b.max_tokens_per_sample, b.max_total_tokens)

    def stage(self, ctx, batch: PackedBatch):
        """Pad for CUDA graphs if configured and write the batch into the context's buffers;
        returns the device views (tokens, positions, cu_seqlens)."""
        tokens, positions, cu = batch.tokens, batch.positions, batch.cu_seqlens
        shape = self.padded_shape(int(tokens.shape[0]), int(cu.shape[0]) - 1)
        if shape is not None:
            tokens, positions, cu = pad_batch(tokens, positions, cu, *shape)
        return ctx.stage(tokens, positions, cu)

    def padded_shape(self, num_tokens: int, num_sequences: int) -> tuple[int, int] | None:
        """(tokens, sequences) a batch is padded to for CUDA graphs; None: not padded."""
        if not self.token_bucket:
            return None
        b = self.bounds
        tokens = bucket_size(num_tokens, self.token_bucket, b.call_max_tokens)
        return (tokens, b.max_samples + 1) if not self.one_prompt else (tokens, num_sequences)

    def warm_batches(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """One synthetic padded batch per shape that `stage` can produce (CPU tensors), to capture
        every CUDA graph at warm-up: each has one-token sequences, then the padding."""
        if not self.token_bucket:
            return []
        b, bucket = self.bounds, self.token_bucket
        # (tokens, one-token sequences before the padding, sequences in all)
        if not self.one_prompt:
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


def concat_packed(batches: Sequence[PackedBatch]) -> PackedBatch:
    """Pack several packed batches into one: sequences back to back, cu_seqlens offset."""
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [b.num_tokens for b in batches[:-1]])
    cu = torch.cat([batches[0].cu_seqlens[:1]] + [b.cu_seqlens[1:] + int(o) for b, o in zip(batches, offsets)])
    return PackedBatch(tokens=torch.cat([b.tokens for b in batches]),
                       positions=torch.cat([b.positions for b in batches]),
                       cu_seqlens=cu, lengths=[n for b in batches for n in b.lengths])


def to_host(ctx, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Copy results to the CPU; the only synchronisation point of a call."""
    with ctx.stream_scope():
        host = [t.to("cpu", non_blocking=False) for t in tensors]
    return [h.numpy() for h in host]


class ScoreResultBuilder:
    """A score call's host outputs -> one result per request.

    The outputs are artifact/tensors.py's score_outputs: probs, then lse and label_logits (label
    mode, artifacts built with them), then top-k when built with it. Which of these a program has
    is told by their count (`outputs` is None: every output is copied), so artifacts built before
    lse existed serve unchanged. Each request's share also carries its samples' token counts."""

    outputs = None  # all of the program's outputs

    def __init__(self, label_token_ids, topk: int):
        self.label_token_ids = [int(i) for i in label_token_ids]
        self.topk = topk

    def split(self, host: list[np.ndarray], batches: Sequence[PackedBatch]) -> list[list[np.ndarray]]:
        shares, row = [], 0
        for packed in batches:  # rows past the last request's are the graph padding's
            rows = [h[row: row + packed.num_samples] for h in host]
            shares.append(rows + [np.asarray(packed.lengths, dtype=np.int64)])
            row += packed.num_samples
        return shares

    def build(self, probs: np.ndarray, *rest: np.ndarray) -> ScoreResult:
        """probs [N, C], then (lse [N], label_logits [N, C]) when present, (topk_ids, topk_probs)
        when built with top-k, and last the samples' token counts [N] (from `split`)."""
        *outputs, lengths = rest
        result = ScoreResult(scores=probs.astype(np.float32, copy=False), label_token_ids=self.label_token_ids,
                             num_tokens=lengths)
        if len(outputs) == 2 + (2 if self.topk else 0):  # lse [N], label_logits [N, C]: log p over the vocabulary
            lse, label_logits = outputs[0].astype(np.float64), outputs[1].astype(np.float64)
            result.label_logprobs = (label_logits - lse[:, None]).astype(np.float32)
            outputs = outputs[2:]
        if self.topk:
            result.topk_ids, result.topk_probs = outputs[0].astype(np.int32), outputs[1].astype(np.float32)
        return result


class BeamResultBuilder:
    """A beam call's host outputs (token_ids, scores, finished: R x W rows) -> one result per request.
    `items`: a search constrained to a catalogue, whose program also returns beam_indices and
    item_ids (programs/constraint.py): each candidate's item id comes with it (-1: none)."""

    outputs = 3  # beam_indices stay on the device

    def __init__(self, tokenizer, stop_token_ids, width: int, items: bool = False):
        self.tokenizer, self.width = tokenizer, width
        self.stop = frozenset(int(t) for t in stop_token_ids)
        if items:
            self.outputs = 5  # ..., beam_indices, item_ids

    def split(self, host: list[np.ndarray], batches: Sequence[PackedBatch]) -> list[list[np.ndarray]]:
        w = self.width
        return [[h[i * w:(i + 1) * w] for h in host] for i in range(len(batches))]

    def build(self, ids: np.ndarray, scores: np.ndarray, finished: np.ndarray, beam_indices: np.ndarray | None = None,
               item_ids: np.ndarray | None = None) -> BeamResult:
        texts = self.tokenizer.decode_array(ids, self.stop)  # padding (-1) and stop tokens are not text
        return BeamResult(token_ids=ids.astype(np.int32), scores=scores.astype(np.float32, copy=False),
                          finished=finished.astype(bool), texts=texts,
                          item_ids=None if item_ids is None else item_ids.astype(np.int64))


def _score_builder(spec, tokenizer, items: bool = False) -> ScoreResultBuilder:
    return ScoreResultBuilder(spec.label_token_ids, spec.topk)


def _beam_builder(spec, tokenizer, items: bool = False) -> BeamResultBuilder:
    return BeamResultBuilder(tokenizer, spec.stop_token_ids, spec.width, items=items)


BUILDERS = {"score": _score_builder, "beam": _beam_builder}  # by task name (artifact/tasks.py)


def make_builder(spec, tokenizer, items: bool = False) -> ScoreResultBuilder | BeamResultBuilder:
    """The result builder of `spec`'s task; `items`: a beam search under a catalogue (its item ids come back)."""
    return BUILDERS[spec.task](spec, tokenizer, items)


def _multiples(step: int, most: int) -> list[int]:
    """step, 2 step, ... up to `most`, and `most` itself (bucket_size caps there)."""
    return sorted(set(range(step, most + 1, step)) | {most})
