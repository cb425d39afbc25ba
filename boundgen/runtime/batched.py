"""`BatchedScoreEngine` / `BatchedBeamEngine`: requests that arrive together share one model call.

The DAG is the same as `DagEngine`'s (tokenize -> model -> encode_scores); what changes is
who runs which node. The caller's thread tokenizes its own request (CPU work scales with
callers); a `Batcher` worker, one per request context, concatenates every waiting request
that fits the artifact's bounds (samples, tokens) into one packed batch, stages it, calls the
model node once and copies the probabilities back; each caller takes its rows. Block-diagonal
attention keeps requests independent: results equal one call per request.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from boundgen.errors import InvalidInput
from boundgen.runtime.batcher import Batcher
from boundgen.runtime.context import RequestContext
from boundgen.runtime.executor import DagEngine
from boundgen.runtime.nodes import _to_host
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.text.tokenizer import PackedBatch


def concat_packed(batches: Sequence[PackedBatch]) -> PackedBatch:
    """Pack several packed batches into one: sequences back to back, cu_seqlens offset."""
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [b.num_tokens for b in batches[:-1]])
    cu = torch.cat([batches[0].cu_seqlens[:1]] + [b.cu_seqlens[1:] + int(o) for b, o in zip(batches, offsets)])
    return PackedBatch(tokens=torch.cat([b.tokens for b in batches]),
                       positions=torch.cat([b.positions for b in batches]),
                       cu_seqlens=cu, lengths=[n for b in batches for n in b.lengths])


class BatchedScoreEngine(DagEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        nodes = {n.spec.name: n for n in self.dag.nodes}
        self._tokenize, self._model, self._encode = nodes["tokenize"], nodes["model"], nodes["encode_scores"]
        bounds = self._tokenize.bounds
        self._max_samples, self._max_tokens = bounds.max_samples, bounds.max_total_tokens
        contexts = [self.pool.acquire() for _ in range(self.pool.size)]  # owned by the workers for good
        self._device = contexts[0].device
        self._batcher = Batcher(contexts, self._run_batch, self._fits, name=f"{self.spec.name}-batch")

    def _fits(self, batch: list, item) -> bool:
        packed = [entry[0] for entry in batch] + [item[0]]
        return (sum(p.num_samples for p in packed) <= self._max_samples
                and sum(p.num_tokens for p in packed) <= self._max_tokens)

    def _run_batch(self, ctx, items):
        start = time.perf_counter()
        packed = concat_packed([p for p, _ in items])
        staged = self._tokenize.stage(ctx, packed)
        out = self._model.run(ctx, staged["tokens"], staged["positions"], staged["cu_seqlens"])
        names = [n for n in self._encode.spec.inputs if n != "num_samples"]
        host = _to_host(ctx, *[out[name][: packed.num_samples] for name in names])
        seconds = time.perf_counter() - start
        results, row = [], 0
        for p, submitted in items:
            rows = [h[row: row + p.num_samples] for h in host]
            row += p.num_samples
            results.append((rows, start - submitted, seconds, len(items)))
        return results

    def score(self, texts: Sequence[str]) -> ScoreResult:
        if self.spec.task != "score" or isinstance(texts, str):
            return super().score(texts)
        t0 = time.perf_counter()
        packed = self._tokenize.encode(list(texts))
        t1 = time.perf_counter()
        rows, queued, model_s, batch_size = self._batcher.submit((packed, t1))
        t2 = time.perf_counter()
        result = ScoreResult(scores=rows[0].astype(np.float32, copy=False), label_token_ids=self._encode.label_token_ids)
        if len(rows) == 3:
            result.topk_ids, result.topk_probs = rows[1].astype(np.int32), rows[2].astype(np.float32)
        result.timings = {"pre": t1 - t0, "queue": queued, "model": model_s, "post": time.perf_counter() - t2,
                          "batch_requests": batch_size, "total": time.perf_counter() - t0}
        return result

    def warmup(self) -> None:
        for inputs in self._warmup_inputs:  # the contexts belong to the batcher: go through it
            self.score(inputs["texts"])

    def model_node(self, texts: Sequence[str]):
        """The model node alone on `texts`, prepared once on a context of its own (the
        framework-overhead diagnostic, bench/diagnostic.py): a zero-argument callable."""
        bounds = self._tokenize.bounds
        ctx = RequestContext(bounds.max_total_tokens, bounds.max_samples, self._device)
        staged = self._tokenize.stage(ctx, self._tokenize.encode(list(texts)))

        def call():
            out = self._model.run(ctx, staged["tokens"], staged["positions"], staged["cu_seqlens"])
            if ctx.stream is not None:
                ctx.stream.synchronize()
            return out

        return call

    def close(self) -> None:
        self._batcher.close()


class BatchedBeamEngine(DagEngine):
    """Beam requests that arrive together run as one program call over R prompts (R x W beams).

    The beam program keeps requests independent (each beam attends to its own prompt's K/V and
    candidates are selected per request), so results equal one call per request. A call holds
    at most `max_requests` prompts and the artifact's token bound for the packed prompts.
    """

    def __init__(self, *args, max_requests: int = 8, **kwargs):
        super().__init__(*args, **kwargs)
        nodes = {n.spec.name: n for n in self.dag.nodes}
        self._tokenize, self._model, self._encode = nodes["tokenize"], nodes["model"], nodes["encode_beams"]
        self._max_requests, self._max_tokens = max_requests, self._tokenize.bounds.call_max_tokens
        self._width = self.spec.width
        contexts = [self.pool.acquire() for _ in range(self.pool.size)]
        self._batcher = Batcher(contexts, self._run_batch, self._fits, name=f"{self.spec.name}-batch")

    def _fits(self, batch: list, item) -> bool:
        packed = [entry[0] for entry in batch] + [item[0]]
        return len(packed) <= self._max_requests and sum(p.num_tokens for p in packed) <= self._max_tokens

    def _run_batch(self, ctx, items):
        start = time.perf_counter()
        staged = self._tokenize.stage(ctx, concat_packed([p for p, _ in items]))
        out = self._model.run(ctx, staged["tokens"], staged["positions"], staged["cu_seqlens"])
        ids, scores, finished = _to_host(ctx, out["token_ids"], out["scores"], out["finished"])
        seconds = time.perf_counter() - start
        w = self._width
        return [((ids[i * w:(i + 1) * w], scores[i * w:(i + 1) * w], finished[i * w:(i + 1) * w]),
                 start - submitted, seconds, len(items)) for i, (_, submitted) in enumerate(items)]

    def beam(self, text: str) -> BeamResult:
        if self.spec.task != "beam" or not isinstance(text, str):
            return super().beam(text)
        t0 = time.perf_counter()
        packed = self._tokenize.encode([text])
        t1 = time.perf_counter()
        rows, queued, model_s, batch_size = self._batcher.submit((packed, t1))
        t2 = time.perf_counter()
        result = self._encode.encode(*rows)
        result.timings = {"pre": t1 - t0, "queue": queued, "model": model_s, "post": time.perf_counter() - t2,
                          "batch_requests": batch_size, "total": time.perf_counter() - t0}
        return result

    def warmup(self) -> None:
        for inputs in self._warmup_inputs:
            self.beam(inputs["text"])

    def close(self) -> None:
        self._batcher.close()
