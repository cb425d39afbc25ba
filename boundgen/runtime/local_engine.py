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
selected per request), so results equal one call per request up to float rounding (a call of
other shapes sums in another order: docs/runtime.md). Deadlines and cancellation are
the batcher's (runtime/batcher.py): a request whose deadline passes, or whose `cancelled` event
is set, while it waits is never run. CUDA graphs are captured in `warmup`, on every context,
for every padded shape (runtime/graphs.py), never while serving.

A constrained beam artifact takes its catalogue's trie as program inputs: the engine holds one
`ServedCatalogue` (runtime/catalogue.py; `set_catalogue`), and each request takes the trie of
that moment (its allow-list's, if any) on the caller thread, so that a replacement never mixes
two catalogues in one request. Requests share a call when they share the catalogue, whatever
their allow-lists: the program takes reach and ends with a row per request (artifact/tensors.py),
request r's allow-list on row r. On the device a request's allow-list is not derived on its
thread: the batch worker derives the lists of a call at once into the call's rows, before the
call, and reads their check (unknown ids: the request's InvalidInput) after it
(runtime/catalogue.py `derive_rows`). With CUDA graphs each context holds trie buffers of one length
M_cap, reach and ends on max_requests rows (runtime/context.py), which its graphs read: a call
first copies its requests' tries into them on the context's stream (the catalogue's arrays only
when the context held another catalogue, a row's reach and ends only when they changed);
without, the call's rows are stacked (`call_trie`). M_cap is fixed when the first catalogue is
set (`catalogue_max_nodes`, else that catalogue's nodes and a quarter more), and the graphs are
captured then, before the catalogue is published, so no request can reach a context before
(`boundgen.load` and `serve` set it before warm-up; a model loaded without one captures at its
first `load_catalogue`). A later catalogue that does not fit M_cap is refused (ConfigError, the
served one stays): growing the buffers would take new graphs, captured while serving.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import Trie, call_trie
from boundgen.errors import ConfigError, InvalidInput
from boundgen.runtime.batcher import Batcher, Ticket
from boundgen.runtime.catalogue import AllowList, RowsCheck, ServedCatalogue, load_catalogue
from boundgen.runtime.context import RequestContext
from boundgen.runtime.engine import Engine, EngineSpec, Provenance
from boundgen.runtime.graphs import GraphRunner
from boundgen.runtime.requests import RequestPacker, concat_packed, make_builder, to_host
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.text import catalogue_search
from boundgen.text.tokenizer import PackedBatch

@dataclass(frozen=True)
class Queued:
    """A tokenized request waiting in the batcher's queue (caller thread -> batch worker)."""

    packed: PackedBatch
    submitted: float  # time.perf_counter() when it was queued
    trie: Trie | None = None  # a constrained program's trie inputs for this request (runtime/catalogue.py)
    allow: AllowList | None = None  # its allow-list, derived into its call's row (runtime/catalogue.py)


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
    def __init__(self, spec: EngineSpec, packer: RequestPacker, runner, builder, contexts: list[RequestContext]):
        """Runs with `spec.runtime`, the settings in effect (`settings_in_effect`): executors,
        batching and its wait reach the semaphore and the batcher from there."""
        self.spec, self.packer, self.runner, self.builder = spec, packer, runner, builder
        self.task = task_of(spec)
        self.graph_shapes = 0  # CUDA graphs captured (warmup; a constrained engine: its first catalogue), per context
        self.contexts = contexts  # owned by the batcher's workers, one each
        self.catalogue: ServedCatalogue | None = None  # a constrained beam artifact's (set_catalogue)
        self.catalogue_max_nodes = 0  # with CUDA graphs: the trie nodes each context holds (0: no catalogue yet)
        self._catalogue_lock = threading.Lock()
        runtime = spec.runtime
        self._executors = threading.Semaphore(runtime.executors)  # program calls running at once
        self._batcher = Batcher(contexts, self._run_batch, self._fits if runtime.batching else _alone, name=spec.name,
                                linger_s=runtime.batch_wait_ms / 1e3 if runtime.batching else 0.0,
                                learn_linger=runtime.batching and runtime.batch_wait_learned)

    # -- the calls ---------------------------------------------------------------------------

    def score(self, texts: Sequence[str], deadline: float | None = None,
              cancelled: threading.Event | None = None) -> ScoreResult:
        texts = self.task.texts("score", texts, self.spec.name, limit=self.packer.bounds.max_samples)
        return self._request(texts, deadline, cancelled)

    def score_ids(self, samples: Sequence[Sequence[int]], deadline: float | None = None,
                  cancelled: threading.Event | None = None) -> ScoreResult:
        if not self.task.takes_token_ids:
            return super().score_ids(samples, deadline, cancelled)
        return self._request(samples, deadline, cancelled, self.packer.pack_ids)

    def beam(self, text: str, deadline: float | None = None, cancelled: threading.Event | None = None,
             allow_items: Sequence[int] | None = None, allow_subset: str | None = None) -> BeamResult:
        """allow_items: item ids a constrained search may return (None: every item of the catalogue);
        allow_subset: a subset registered with the catalogue, by name (with allow_items: both apply)."""
        return self._request(self.task.texts("beam", text, self.spec.name, limit=1), deadline, cancelled,
                             allow_items=allow_items, allow_subset=allow_subset)

    @property
    def constrained(self) -> bool:
        """Whether the program takes a catalogue's trie as inputs (a constrained beam artifact)."""
        return self.task.constrained(self.spec.program)

    def set_catalogue(self, catalogue: ServedCatalogue) -> None:
        """Serve later requests with this catalogue (requests already tokenized keep theirs). With
        CUDA graphs, the first one sizes the contexts' trie buffers and the graphs are captured; a
        later one that does not fit them is a ConfigError, and the served catalogue stays."""
        if not self.constrained:
            raise ConfigError(f"model {self.spec.name} was not built with --constrained: it takes no catalogue")
        with self._catalogue_lock:
            if self.spec.runtime.cuda_graphs:
                self._fit(catalogue)
            self.catalogue = catalogue

    def _fit(self, catalogue: ServedCatalogue) -> None:
        """Check `catalogue` against the contexts' trie buffers; allocate them and capture the graphs
        for the first (no request can run before `set_catalogue` publishes it)."""
        nodes = catalogue.catalogue.num_nodes
        first = self.catalogue_max_nodes == 0
        most = (self.spec.runtime.catalogue_max_nodes or nodes + nodes // 4) if first else self.catalogue_max_nodes
        if catalogue_search.length(nodes) > catalogue_search.length(most):
            raise ConfigError(f"catalogue {catalogue.path or '(given in process)'} has {nodes:,} trie nodes; model "
                              f"{self.spec.name} holds at most {most:,} in each request context, for its CUDA graphs "
                              "(--catalogue-max-nodes, else its first catalogue's nodes and a quarter more): serve it "
                              f"with --catalogue-max-nodes {nodes} or more, or with --no-cuda-graphs")
        if first:
            for ctx in self.contexts:
                ctx.hold_trie(catalogue_search.length(most), self.spec.program.call_max_samples)
            self._capture(catalogue.full)
            self.catalogue_max_nodes = most

    def load_catalogue(self, cat_dir) -> None:
        """Read a catalogue directory, check it against this artifact and serve later requests with it."""
        if not self.constrained or self.spec.provenance is None:
            raise ConfigError(f"model {self.spec.name} was not built with --constrained: it takes no catalogue")
        self.set_catalogue(load_catalogue(cat_dir, self.spec.provenance.artifact_dir, self.contexts[0].device))

    def _trie(self, allow_items: Sequence[int] | None,
              allow_subset: str | None = None) -> tuple[Trie | None, AllowList | None]:
        """The trie inputs of a request (None: an unconstrained program) and its allow-list still to
        derive (runtime/catalogue.py: `_call` derives a call's lists into its rows, `_run_batch`
        reads their check once the call is done)."""
        if not self.constrained:
            for given, name in ((allow_items, "ALLOW_ITEMS"), (allow_subset, "ALLOW_SUBSET")):
                if given is not None:
                    raise InvalidInput(f"model {self.spec.name} has no catalogue: {name} does not apply")
            return None, None
        catalogue = self.catalogue  # one read: the whole request sees this catalogue
        if catalogue is None:
            raise InvalidInput(f"model {self.spec.name} is a constrained beam model and no catalogue is loaded")
        return catalogue.request_trie(allow_items, allow_subset)

    def _request(self, texts: list, deadline: float | None, cancelled: threading.Event | None, pack=None,
                 allow_items: Sequence[int] | None = None, allow_subset: str | None = None):
        t0 = time.perf_counter()
        packed = (pack or self.packer.encode)(texts)
        trie, allow = self._trie(allow_items, allow_subset)
        t1 = time.perf_counter()
        share: CallShare = self._batcher.submit(Queued(packed, t1, trie, allow), deadline, cancelled)
        t2 = time.perf_counter()
        result = self.builder.build(*share.rows)
        end = time.perf_counter()
        result.timings = {"pre": t1 - t0, **share.timings(), "post": end - t2, "total": end - t0,
                          "input_tokens": packed.num_tokens}
        return result

    # -- packed requests from another process (server/deploy/) --------------------------------

    def enqueue(self, packed: PackedBatch, deadline: float | None = None, cancelled: threading.Event | None = None,
                client: str = "", max_queue: int | None = None, allow_items: Sequence[int] | None = None,
                allow_subset: str | None = None) -> Ticket:
        """Queue a request tokenized elsewhere (a front-end process) without waiting; the ticket's
        future gets its `CallShare`. Raises DeadlineExceeded or Cancelled if it is already gone, and
        Overloaded if `max_queue` requests wait (the batcher's fair queue: `client` is who sent it).
        allow_items: a constrained request's allow-list ([K] int64), its trie derived here as `beam`
        derives it (InvalidInput for unknown ids, or a list that leaves nothing); allow_subset: a
        named subset of its catalogue (its trie inputs derived at load)."""
        trie, allow = self._trie(allow_items, allow_subset)
        return self._batcher.enqueue(Queued(packed, time.perf_counter(), trie, allow), deadline, cancelled, client,
                                     max_queue)

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
        return (one_catalogue(item.trie, batch[0].trie)  # allow-lists may differ: a row each
                and fits_one_call(self.spec.program, [queued.packed for queued in batch] + [item.packed]))

    def _call(self, ctx: RequestContext, tokens, positions, cu_seqlens, tries: Sequence[Trie] | None = None,
              allows: Sequence[AllowList | None] = ()) -> tuple[list[torch.Tensor], RowsCheck | None]:
        """The program on staged inputs, on the context's stream; its outputs stay on the device.
        tries: the requests' (one each, in call order), copied first into the context's trie
        buffers where it holds them, else stacked; allows: their allow-lists (None: none), derived
        into their rows before the call, whose check is returned to read after it."""
        with self._executors, ctx.stream_scope():
            trie, check = None, None
            if tries:
                derived = [r for r, allow in enumerate(allows) if allow is not None]
                trie = ctx.stage_trie(tries, derived) if ctx.trie is not None else call_trie(tries)
                if derived:
                    check = allows[derived[0]].catalogue.derive_rows(trie.reach, trie.ends, allows)
            return self.runner(tokens, positions, cu_seqlens, *(trie or ())), check

    def _run_batch(self, ctx: RequestContext, items: list[Queued]) -> list[CallShare | InvalidInput]:
        """The call of `items`: each request's share of it, or the InvalidInput its allow-list
        turned out to deserve (the derivation's check, read once the call is done)."""
        start = time.perf_counter()
        batches = [queued.packed for queued in items]
        tries = [queued.trie for queued in items] if items[0].trie is not None else None
        out, check = self._call(ctx, *self.packer.stage(ctx, concat_packed(batches)), tries=tries,
                                allows=[queued.allow for queued in items])
        host = to_host(ctx, out[:self.builder.outputs])
        errors = check.errors() if check is not None else {}
        seconds = time.perf_counter() - start
        return [errors.get(r) or CallShare(rows, start - queued.submitted, seconds, len(items))
                for r, (rows, queued) in enumerate(zip(self.builder.split(host, batches), items))]

    # -- lifecycle ---------------------------------------------------------------------------

    def warmup(self) -> None:
        """One request through the whole path, then every CUDA graph captured on every context
        (nothing to capture without graphs). Call before serving: the workers are idle. A
        constrained engine without a catalogue has nothing to run yet: its graphs are captured
        when its first catalogue is set, and a warmup after that captures nothing again."""
        if self.constrained and self.catalogue is None:
            return
        self._request(["warm up"], None, None)
        if not (self.constrained and self.catalogue_max_nodes):  # set_catalogue's `_fit` captured them
            self._capture(self._trie(None)[0])

    def _capture(self, trie: Trie | None) -> None:
        """Every padded shape once on every context: captured where not yet, replayed where captured."""
        batches = self.packer.warm_batches() if isinstance(self.runner, GraphRunner) else []
        for ctx in self.contexts:
            for tokens, positions, cu_seqlens in batches:
                tries = [trie] * (cu_seqlens.shape[0] - 1) if trie is not None else None  # beam: a prompt a request
                self._call(ctx, *ctx.stage(tokens, positions, cu_seqlens), tries=tries)
                if ctx.stream is not None:  # the host buffers are rewritten by the next stage
                    ctx.stream.synchronize()
        self.graph_shapes = len(batches)

    def program_call(self, texts: Sequence[str], copies: int = 1):
        """The program alone on `copies` copies of the request `texts` in one call, staged once on a
        context of its own (the framework-overhead diagnostic, bench/diagnostic.py; the cost of a
        call against the requests it holds, bench/calls.py): a zero-argument callable that returns
        once the device is done."""
        b = self.spec.program
        ctx = RequestContext(b.call_max_tokens, b.call_max_samples, self.contexts[0].device)
        if self.contexts[0].trie is not None:
            ctx.hold_trie(self.contexts[0].trie.row_ptr.shape[0], b.call_max_samples)
        packed = self.packer.encode(list(texts))
        batches = [packed] * copies
        if not fits_one_call(b, batches):
            raise ValueError(f"{copies} copies of this request exceed one call's bounds ({b.describe()})")
        staged = self.packer.stage(ctx, concat_packed(batches))
        trie, _ = self._trie(None)
        tries = [trie] * copies if trie is not None else None

        def call():
            out, _ = self._call(ctx, *staged, tries=tries)
            if ctx.stream is not None:
                ctx.stream.synchronize()
            return out

        return call

    def close(self) -> None:
        self._batcher.close()


def one_catalogue(a: Trie | None, b: Trie | None) -> bool:
    """Whether two requests' tries are one catalogue's (allow-lists aside; both None: unconstrained)."""
    return a is b or (a is not None and b is not None and a.row_ptr is b.row_ptr)


def fits_one_call(program, batches: Sequence[PackedBatch]) -> bool:
    """Whether packed requests fit one program call's bounds (samples and tokens)."""
    return (sum(p.num_samples for p in batches) <= program.call_max_samples
            and sum(p.num_tokens for p in batches) <= program.call_max_tokens)


def _alone(batch: list, item) -> bool:
    return False  # without batching a call holds one request


def settings_in_effect(runtime: RuntimeConfig, spec, device: str) -> RuntimeConfig:
    """The runtime settings as they take effect for program `spec` on `device`; the one place that
    decides: CUDA graphs only on a CUDA device (a constrained beam program's too: its contexts then
    hold the trie, runtime/context.py), batching only where one call may hold more than one
    request (artifact/tasks.py), and its wait only with batching."""
    batching = runtime.batching and task_of(spec).max_requests(spec) > 1
    graphs = runtime.cuda_graphs and str(device).startswith("cuda")
    return replace(runtime, cuda_graphs=graphs, batching=batching,
                   batch_wait_ms=runtime.batch_wait_ms if batching else 0.0,
                   batch_wait_learned=runtime.batch_wait_learned and batching)


def make_engine(name: str, spec, tokenizer, runner, device: str, dtype: str, runtime: RuntimeConfig, *,
                vocab_outputs: bool, fp8_groups: Sequence[str] = (), provenance: Provenance | None = None,
                item_ids: bool = False) -> LocalEngine:
    """Assemble the engine around a runner (a compiled artifact's, or the eager program's).

    With CUDA graphs in effect (`settings_in_effect`) the runner is wrapped in a GraphRunner and
    calls are padded to multiples of `runtime.token_bucket` tokens (runtime/graphs.py). `item_ids`:
    the runner is a beam search under a catalogue, whose candidates carry item ids."""
    runtime = settings_in_effect(runtime, spec, device)
    item_ids = item_ids or task_of(spec).constrained(spec)
    if runtime.cuda_graphs:
        runner = GraphRunner(runner)
    packer = RequestPacker(tokenizer, spec, runtime.token_bucket if runtime.cuda_graphs else 0)
    builder = make_builder(spec, tokenizer, items=item_ids)
    dev = torch.device(device)
    contexts = [RequestContext(spec.call_max_tokens, spec.call_max_samples, dev) for _ in range(runtime.contexts)]
    # Requests the server should let in at once: one per context, more when they share calls.
    concurrency = runtime.contexts * (task_of(spec).max_requests(spec) if runtime.batching else 1)
    engine_spec = EngineSpec(name, spec, device, dtype, runtime, concurrency, vocab_outputs, tuple(fp8_groups),
                             provenance=provenance)
    return LocalEngine(engine_spec, packer, runner, builder, contexts)
