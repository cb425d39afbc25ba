"""`LocalEngine`: the one execution path of every request over a loaded program.

    caller thread:  texts -> RequestPacker.encode (bounds, tokens)           "pre"
                    -> Batcher.submit, waits                                  "queue"
    batch worker:   requests taken together (one when batching is off) -> concat_packed
      (one per      -> RequestPacker.stage (pad for CUDA graphs, copy into its context)
       context)     -> program call on the context's stream (GraphRunner replays a graph)
                    -> to_host -> each request's rows                         "model"
    caller thread:  rows -> ScoreResultBuilder / BeamResultBuilder -> result  "post"

A batch of one is the unbatched case: without batching, the batcher's `fits` admits no second
request, so each call holds one request, exactly as a batched engine's lone request. Programs
keep requests independent (block-diagonal attention; beams attend to their own prompt and are
selected per request), so results equal one call per request. Deadlines and cancellation are
the batcher's (runtime/batcher.py): a request whose deadline passes, or whose `cancelled` event
is set, while it waits is never run. CUDA graphs are captured in `warmup`, on every context,
for every padded shape (runtime/graphs.py), never while serving.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.errors import InvalidInput
from boundgen.runtime.batcher import Batcher, Ticket
from boundgen.runtime.context import RequestContext
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.graphs import GraphRunner
from boundgen.runtime.requests import BeamResultBuilder, RequestPacker, ScoreResultBuilder, concat_packed, to_host
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.text.tokenizer import PackedBatch

# Requests one batched score call may hold (a beam program records its own, BeamSpec.max_requests; a score
# program's bounds count samples and tokens): admission's room per context when score requests share calls.
SCORE_MAX_REQUESTS = 8


@dataclass(frozen=True)
class Queued:
    """A tokenized request waiting in the batcher's queue (caller thread -> batch worker)."""

    packed: PackedBatch
    submitted: float  # time.perf_counter() when it was queued


@dataclass(frozen=True)
class CallShare:
    """A request's part of a call's host outputs (batch worker -> caller): the rows its result builder
    turns into a result, and what the call cost it."""

    rows: list  # [np.ndarray]: the program's outputs, this request's rows
    queue_s: float  # queued until its call started
    model_s: float  # the call, staging to rows on the host
    requests_in_call: int

    def timings(self) -> dict:
        return {"queue": self.queue_s, "model": self.model_s, "batch_requests": self.requests_in_call}


class LocalEngine(Engine):
    def __init__(self, spec: EngineSpec, packer: RequestPacker, runner, builder, contexts: list[RequestContext],
                 executors: int = 1, batching: bool = False, batch_wait_ms: float = 0.0):
        self.spec, self.packer, self.runner, self.builder = spec, packer, runner, builder
        self.contexts = contexts  # owned by the batcher's workers, one each
        self.batching = batching
        self._executors = threading.Semaphore(max(1, executors))  # program calls running at once
        self._batcher = Batcher(contexts, self._run_batch, self._fits if batching else _alone, name=spec.name,
                                linger_s=batch_wait_ms / 1e3 if batching else 0.0)

    # -- the calls ---------------------------------------------------------------------------

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        if self.spec.task != "score":
            return super().score(texts, deadline, cancelled)
        if isinstance(texts, str):
            raise InvalidInput("score takes a list of texts, got a single string")
        return self._request(list(texts), deadline, cancelled)

    def score_ids(self, samples: Sequence[Sequence[int]], deadline: float | None = None,
                  cancelled: threading.Event | None = None) -> ScoreResult:
        if self.spec.task != "score":
            return super().score_ids(samples, deadline, cancelled)
        return self._request(samples, deadline, cancelled, self.packer.pack_ids)

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None) -> BeamResult:
        if self.spec.task != "beam":
            return super().beam(text, deadline, cancelled)
        if not isinstance(text, str):
            raise InvalidInput(f"beam takes one prompt text, got {type(text).__name__}")
        return self._request([text], deadline, cancelled)

    def _request(self, texts: list, deadline: float | None, cancelled: threading.Event | None, pack=None):
        t0 = time.perf_counter()
        packed = (pack or self.packer.encode)(texts)
        t1 = time.perf_counter()
        share: CallShare = self._batcher.submit(Queued(packed, t1), deadline, cancelled)
        t2 = time.perf_counter()
        result = self.builder.build(*share.rows)
        end = time.perf_counter()
        result.timings = {"pre": t1 - t0, **share.timings(), "post": end - t2, "total": end - t0,
                          "input_tokens": packed.num_tokens}
        return result

    # -- packed requests from another process (server/frontend/) ------------------------------

    def enqueue(self, packed: PackedBatch, deadline: float | None = None, cancelled: threading.Event | None = None,
                client: str = "", max_queue: int | None = None) -> Ticket:
        """Queue a request tokenized elsewhere (a front-end process) without waiting; the ticket's
        future gets its `CallShare`. Raises DeadlineExceeded or Cancelled if it is already gone, and
        Overloaded if `max_queue` requests wait (the batcher's fair queue: `client` is who sent it)."""
        return self._batcher.enqueue(Queued(packed, time.perf_counter()), deadline, cancelled, client, max_queue)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a queued request back out (its client went away, or its deadline passed);
        False if it is already in a call."""
        return self._batcher.withdraw(ticket)

    @property
    def queued(self) -> int:
        """Requests waiting for a call now."""
        return self._batcher.queued

    # -- the batch worker's side -----------------------------------------------------------

    def _fits(self, batch: list, item) -> bool:
        """Whether waiting request `item` may join the call that holds `batch` (the batcher's rule)."""
        return fits_one_call(self.spec.program, [queued.packed for queued in batch] + [item.packed])

    def _call(self, ctx: RequestContext, tokens, positions, cu_seqlens) -> list[torch.Tensor]:
        """The program on staged inputs, on the context's stream; its outputs stay on the device."""
        with self._executors, ctx.stream_scope():
            return self.runner(tokens, positions, cu_seqlens)

    def _run_batch(self, ctx: RequestContext, items: list[Queued]) -> list[CallShare]:
        start = time.perf_counter()
        batches = [queued.packed for queued in items]
        out = self._call(ctx, *self.packer.stage(ctx, concat_packed(batches)))
        host = to_host(ctx, out[:self.builder.outputs])
        seconds = time.perf_counter() - start
        return [CallShare(rows, start - queued.submitted, seconds, len(items))
                for rows, queued in zip(self.builder.split(host, batches), items)]

    # -- lifecycle ---------------------------------------------------------------------------

    def warmup(self) -> None:
        """One request through the whole path, then every CUDA graph captured on every context
        (nothing to capture without graphs). Call before serving: the workers are idle."""
        if self.spec.task == "score":
            self.score(["warm up"])
        else:
            self.beam("warm up")
        batches = self.packer.warm_batches() if isinstance(self.runner, GraphRunner) else []
        for ctx in self.contexts:
            for tokens, positions, cu_seqlens in batches:
                self._call(ctx, *ctx.stage(tokens, positions, cu_seqlens))
                if ctx.stream is not None:  # the host buffers are rewritten by the next stage
                    ctx.stream.synchronize()
        self.spec.extra["graph_shapes"] = len(batches)

    def program_call(self, texts: Sequence[str], copies: int = 1):
        """The program alone on `copies` copies of the request `texts` in one call, staged once on a
        context of its own (the framework-overhead diagnostic, bench/diagnostic.py; the cost of a
        call against the requests it holds, bench/calls.py): a zero-argument callable that returns
        once the device is done."""
        b = self.spec.program
        ctx = RequestContext(b.call_max_tokens, b.call_max_samples, self.contexts[0].device)
        packed = self.packer.encode(list(texts))
        batches = [packed] * copies
        if not fits_one_call(b, batches):
            raise ValueError(f"{copies} copies of this request exceed one call's bounds ({b.describe()})")
        staged = self.packer.stage(ctx, concat_packed(batches))

        def call():
            out = self._call(ctx, *staged)
            if ctx.stream is not None:
                ctx.stream.synchronize()
            return out

        return call

    def close(self) -> None:
        self._batcher.close()


def fits_one_call(program, batches: Sequence[PackedBatch]) -> bool:
    """Whether packed requests fit one program call's bounds (samples and tokens)."""
    return (sum(p.num_samples for p in batches) <= program.call_max_samples
            and sum(p.num_tokens for p in batches) <= program.call_max_tokens)


def _alone(batch: list, item) -> bool:
    return False  # without batching a call holds one request


def make_engine(name: str, spec, tokenizer, runner, device: str, dtype: str, runtime: RuntimeConfig,
                extra: dict | None = None, item_ids: bool = False) -> LocalEngine:
    """Assemble the engine around a runner (a compiled artifact's, or the eager program's).

    With `runtime.cuda_graphs` on a CUDA device the runner is wrapped in a GraphRunner and calls
    are padded to multiples of `runtime.token_bucket` tokens (runtime/graphs.py). `item_ids`: the
    runner is a beam search under a catalogue, whose candidates carry item ids."""
    use_graphs = runtime.cuda_graphs and device.startswith("cuda")
    if use_graphs:
        runner = GraphRunner(runner)
    packer = RequestPacker(tokenizer, spec, runtime.token_bucket if use_graphs else 0)
    if spec.task == "score":
        builder = ScoreResultBuilder(spec.label_token_ids, spec.topk)
        max_requests = SCORE_MAX_REQUESTS
    else:
        builder = BeamResultBuilder(tokenizer, spec.stop_token_ids, spec.width, items=item_ids)
        max_requests = spec.max_requests
    batching = runtime.batching and max_requests > 1
    dev = torch.device(device)
    contexts = [RequestContext(spec.call_max_tokens, spec.call_max_samples, dev) for _ in range(runtime.contexts)]
    extra = {**(extra or {}), "contexts": runtime.contexts, "executors": runtime.executors, "cuda_graphs": use_graphs,
             "batching": batching, "batch_wait_ms": runtime.batch_wait_ms if batching else 0.0,
             # Requests the server should let in at once: one per context, more when they share calls.
             "concurrency": runtime.contexts * (max_requests if batching else 1)}
    return LocalEngine(EngineSpec(name, spec, device, dtype, extra), packer, runner, builder, contexts,
                       runtime.executors, batching, runtime.batch_wait_ms)
