"""`BatchedScoreEngine` / `BatchedBeamEngine`: requests that arrive together share one model call.

The DAG is the same as `DagEngine`'s (tokenize -> model -> encode); what changes is who runs
which node. The caller's thread tokenizes its own request (CPU work scales with callers); a
`Batcher` worker, one per request context, concatenates every waiting request that fits the
call's bounds into one packed batch, stages it, calls the model node once and copies the
outputs back; each caller takes its rows and encodes its own result. The programs keep
requests independent (block-diagonal attention; beams attend to their own prompt and are
selected per request), so results equal one call per request. A request whose deadline passes,
or whose `cancelled` event is set, while it waits for a worker is not run (runtime/batcher.py).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import numpy as np
import torch

from boundgen.runtime.batcher import Batcher
from boundgen.runtime.context import RequestContext
from boundgen.runtime.executor import DagEngine
from boundgen.runtime.nodes import to_host
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


class _BatchedEngine(DagEngine):
    """What both batched engines share: the nodes, the batcher that owns the contexts, timings."""

    encode_node = ""  # name of the DAG's encode node

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        nodes = {n.spec.name: n for n in self.dag.nodes}
        self._tokenize, self._model, self._encode = nodes["tokenize"], nodes["model"], nodes[self.encode_node]
        self._bounds = self._tokenize.bounds
        self._contexts = [self.pool.acquire() for _ in range(self.pool.size)]  # owned by the workers for good
        self._device = self._contexts[0].device
        self._batcher = Batcher(self._contexts, self._run_batch, self._fits, name=self.spec.name)

    def _fits(self, batch: list, item) -> bool:
        raise NotImplementedError

    def _split(self, host: list, items: list) -> list:
        """Host outputs of one call -> each item's share."""
        raise NotImplementedError

    def _outputs(self) -> list[str]:
        return [n for n in self._encode.spec.inputs if n != "num_samples"]

    def _run_batch(self, ctx, items):
        start = time.perf_counter()
        packed = concat_packed([p for p, _ in items])
        staged = self._tokenize.stage(ctx, packed)
        out = self._model.run(ctx, staged["tokens"], staged["positions"], staged["cu_seqlens"])
        host = to_host(ctx, *[out[name] for name in self._outputs()])
        seconds = time.perf_counter() - start
        return [(share, start - submitted, seconds, len(items))
                for share, (_, submitted) in zip(self._split(host, items), items)]

    def _submit(self, texts: list[str], deadline: float | None, cancelled: threading.Event | None):
        """Tokenize here, run in some batch unless `deadline` passes or `cancelled` is set first;
        returns (this request's outputs, timings)."""
        t0 = time.perf_counter()
        packed = self._tokenize.encode(texts)
        t1 = time.perf_counter()
        share, queued, model_s, batch_size = self._batcher.submit((packed, t1), deadline, cancelled)
        return share, {"pre": t1 - t0, "queue": queued, "model": model_s, "batch_requests": batch_size,
                       "start": t0, "returned": time.perf_counter()}

    @staticmethod
    def _finish(result, timings):
        end = time.perf_counter()
        timings["post"] = end - timings.pop("returned")
        timings["total"] = end - timings.pop("start")
        result.timings = timings
        return result

    def warmup(self) -> None:
        for inputs in self._warmup_inputs:  # the contexts belong to the batcher: go through it
            if "texts" in inputs:
                self.score(inputs["texts"])
            else:
                self.beam(inputs["text"])
        self._capture_graphs(self._contexts)  # before serving: the batcher's workers are idle

    def model_node(self, texts: Sequence[str]):
        """The model node alone on `texts`, prepared once on a context of its own (the
        framework-overhead diagnostic, bench/diagnostic.py): a zero-argument callable."""
        ctx = RequestContext(self._bounds.call_max_tokens, self._bounds.call_max_samples, self._device)
        staged = self._tokenize.stage(ctx, self._tokenize.encode(list(texts)))

        def call():
            out = self._model.run(ctx, staged["tokens"], staged["positions"], staged["cu_seqlens"])
            if ctx.stream is not None:
                ctx.stream.synchronize()
            return out

        return call

    def close(self) -> None:
        self._batcher.close()


class BatchedScoreEngine(_BatchedEngine):
    """A call holds at most the artifact's max_samples samples and max_total_tokens tokens."""

    encode_node = "encode_scores"

    def _fits(self, batch: list, item) -> bool:
        packed = [entry[0] for entry in batch] + [item[0]]
        return (sum(p.num_samples for p in packed) <= self._bounds.max_samples
                and sum(p.num_tokens for p in packed) <= self._bounds.max_total_tokens)

    def _split(self, host, items):
        shares, row = [], 0
        for packed, _ in items:  # rows past the last request's are the graph padding's
            shares.append([h[row: row + packed.num_samples] for h in host])
            row += packed.num_samples
        return shares

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        if self.spec.task != "score" or isinstance(texts, str):
            return super().score(texts, deadline, cancelled)
        rows, timings = self._submit(list(texts), deadline, cancelled)
        return self._finish(self._encode.encode(*rows), timings)


class BatchedBeamEngine(_BatchedEngine):
    """A call holds at most `max_requests` prompts (R x W beams) and the spec's call token bound."""

    encode_node = "encode_beams"

    def __init__(self, *args, max_requests: int = 8, **kwargs):
        self._max_requests = max_requests
        super().__init__(*args, **kwargs)

    def _outputs(self) -> list[str]:
        return ["token_ids", "scores", "finished"]

    def _fits(self, batch: list, item) -> bool:
        packed = [entry[0] for entry in batch] + [item[0]]
        return len(packed) <= self._max_requests and sum(p.num_tokens for p in packed) <= self._bounds.call_max_tokens

    def _split(self, host, items):
        w = self.spec.width
        return [[h[i * w:(i + 1) * w] for h in host] for i in range(len(items))]

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        if self.spec.task != "beam" or not isinstance(text, str):
            return super().beam(text, deadline, cancelled)
        rows, timings = self._submit([text], deadline, cancelled)
        return self._finish(self._encode.encode(*rows), timings)
