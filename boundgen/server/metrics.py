"""Prometheus metrics served at GET /metrics, in a registry of the server's own.

    boundgen_requests_total{model,protocol,outcome}      counter; outcome is one of status.py's
                                                         (success, invalid_input, rejected,
                                                         deadline_exceeded, unavailable,
                                                         unauthenticated, cancelled, read_timeout,
                                                         internal_error)
    boundgen_request_seconds{model,protocol}             histogram, end to end inside the server
    boundgen_queue_seconds{model}                        histogram, wait for an in-flight slot
    boundgen_compute_seconds{model}                      histogram, engine call on the worker thread
    boundgen_engine_stage_seconds{model,stage}           histogram, the engine's own timings in
                                                         seconds (pre, queue, model, post, ...)
    boundgen_requests_per_call{model}                    histogram, per request: how many requests
                                                         shared its model call (1: alone)
    boundgen_input_tokens_total{model}                   counter, prompt tokens of successful
                                                         requests, when the engine reports them
    boundgen_samples_total{model}                        counter, texts scored (score models)
    boundgen_candidates_total{model}                     counter, candidates returned (beam models)
    boundgen_inflight_requests{model}                    gauge
    boundgen_queue_depth{model}                          gauge
    boundgen_ready                                       gauge, 1 once loaded and warmed up, 0 while draining
    boundgen_gpu_memory_allocated_bytes{device}          gauges read at scrape time (GpuMemory), only
    boundgen_gpu_memory_reserved_bytes{device}           in a process where torch has initialised CUDA

An engine result's `timings` mix seconds with counts: `batch_requests` (requests in the call)
and `input_tokens` (the request's tokens) are counts, so they feed their own metrics and never
the seconds histogram (COUNTS). `model` is "" for requests naming no known model, so that
clients cannot grow the label set. `add_constant_labels` adds labels to every sample this
registry renders (a front-end process of `serve --frontends N` is `frontend="K"`).

`phase_totals(model)` reads the same metrics back as cumulative (count, seconds) per phase, for
Triton's statistics extension (triton_extensions.py); only the split of end-to-end time into
successes and failures is kept beside them, since the request histogram has no outcome label.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from boundgen.artifact.tasks import Task
from boundgen.runtime.results import TIMING_COUNTS

# Seconds; dense around the latency budget (mean < 20 ms, P99 < 80 ms).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.08, 0.1,
                   0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Requests in one model call: 1 (alone) up to the largest batches a context holds.
CALL_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
COUNTS = TIMING_COUNTS  # timings that are counts, not seconds
CONTENT_TYPE = CONTENT_TYPE_LATEST


class GpuMemory:
    """A collector of torch's CUDA memory per device, read at scrape time: allocated (by tensors)
    and reserved (held by the caching allocator, what other processes cannot use). It reports
    nothing unless this process has torch imported and CUDA initialised: it never imports torch
    or creates a CUDA context itself (a scrape of a CPU server, or of a front end, costs nothing)."""

    def collect(self) -> Iterator[Metric]:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        allocated = GaugeMetricFamily("boundgen_gpu_memory_allocated_bytes",
                                      "GPU memory held by this process's tensors (torch.cuda.memory_allocated)",
                                      labels=["device"])
        reserved = GaugeMetricFamily("boundgen_gpu_memory_reserved_bytes",
                                     "GPU memory reserved by this process's caching allocator "
                                     "(torch.cuda.memory_reserved)", labels=["device"])
        for index in range(torch.cuda.device_count()):
            device = f"cuda:{index}"
            allocated.add_metric([device], float(torch.cuda.memory_allocated(index)))
            reserved.add_metric([device], float(torch.cuda.memory_reserved(index)))
        yield allocated
        yield reserved


class _Labelled:
    """A registry's samples with constant labels added to each (what `render` writes)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry, self.labels = registry, labels

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s._replace(labels={**self.labels, **s.labels}) for s in family.samples]
            yield family


class ServerMetrics:
    def __init__(self, on_request: Callable[[str, str, str, float], None] | None = None):
        """on_request(model, protocol, outcome, seconds): also told of every request (the access log)."""
        self.on_request = on_request
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("boundgen_requests", "Inference requests by model, protocol and outcome",
                                ["model", "protocol", "outcome"], registry=r)
        self.request_seconds = Histogram("boundgen_request_seconds", "End-to-end time of an inference request "
                                         "inside the server", ["model", "protocol"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("boundgen_queue_seconds", "Time a request waited for an in-flight slot",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.compute_seconds = Histogram("boundgen_compute_seconds", "Engine call time of a request",
                                         ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.stage_seconds = Histogram("boundgen_engine_stage_seconds", "Engine-reported time per stage",
                                       ["model", "stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.requests_per_call = Histogram("boundgen_requests_per_call", "Requests that shared a request's "
                                           "model call, observed once per request", ["model"],
                                           buckets=CALL_BUCKETS, registry=r)
        self.input_tokens = Counter("boundgen_input_tokens", "Prompt tokens of successful requests, as the "
                                    "engine counted them", ["model"], registry=r)
        self.samples = Counter("boundgen_samples", "Texts scored by successful score requests", ["model"],
                               registry=r)
        self.candidates = Counter("boundgen_candidates", "Candidates returned by successful beam requests",
                                  ["model"], registry=r)
        self.inflight = Gauge("boundgen_inflight_requests", "Requests running on the engine", ["model"], registry=r)
        self.queue_depth = Gauge("boundgen_queue_depth", "Requests waiting for an in-flight slot", ["model"],
                                 registry=r)
        self.ready = Gauge("boundgen_ready", "1 when the server is ready for inference", registry=r)
        r.register(GpuMemory())
        self.constant_labels: dict[str, str] = {}
        # Per model: {"success" | "fail": [count, seconds]}, and the wall time of the last success.
        # Written on the event loop only (observe_request's callers), so no lock.
        self._outcomes: dict[str, dict[str, list]] = defaultdict(lambda: {"success": [0, 0.0], "fail": [0, 0.0]})
        self._last_success: dict[str, float] = {}

    def observe_request(self, model: str, protocol: str, outcome: str, seconds: float) -> None:
        if self.on_request is not None:
            self.on_request(model, protocol, outcome, seconds)
        self.requests.labels(model, protocol, outcome).inc()
        self.request_seconds.labels(model, protocol).observe(seconds)
        if model:
            totals = self._outcomes[model]["success" if outcome == "success" else "fail"]
            totals[0] += 1
            totals[1] += seconds
            if outcome == "success":
                self._last_success[model] = time.time()

    def phase_totals(self, model: str) -> dict[str, tuple[int, float]]:
        """Cumulative (count, seconds) of one model's requests per phase: `success` and `fail`
        (end to end, by outcome), `queue` (wait for a slot), `compute` (the engine call), and
        the engine's own stages by name (`pre`, `model`, `post`, `context_wait`)."""
        sums: dict[tuple[str, str], float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.labels.get("model") == model and sample.name.endswith(("_sum", "_count")):
                    sums[(sample.name, sample.labels.get("stage", ""))] = sample.value
        totals = {name: (int(sums.get((f"{metric}_count", ""), 0)), sums.get((f"{metric}_sum", ""), 0.0))
                  for name, metric in (("queue", "boundgen_queue_seconds"), ("compute", "boundgen_compute_seconds"))}
        for (name, stage), value in sums.items():
            if name == "boundgen_engine_stage_seconds_count":
                totals[stage] = (int(value), sums[("boundgen_engine_stage_seconds_sum", stage)])
        outcomes = self._outcomes.get(model, {"success": [0, 0.0], "fail": [0, 0.0]})
        totals.update({key: (count, seconds) for key, (count, seconds) in outcomes.items()})
        return totals

    def last_success(self, model: str) -> float | None:
        """The wall time (time.time()) of the model's last successful request; None before one."""
        return self._last_success.get(model)

    def queue_observer(self, model: str) -> Callable[[float], None]:
        return self.queue_seconds.labels(model).observe

    def compute_observer(self, model: str) -> Callable[[float], None]:
        return self.compute_seconds.labels(model).observe

    def observe_result(self, model: str, result, task: Task) -> None:
        """What a successful engine call of `task` reports (a ScoreResult or BeamResult): its
        timings by stage (the seconds; `batch_requests` and `input_tokens` to their own metrics),
        and its rows: the samples or candidates it returns (`task.result_rows`)."""
        timings = result.timings
        for stage, seconds in timings.items():
            if stage != "total" and stage not in COUNTS:
                self.stage_seconds.labels(model, stage).observe(seconds)
        if "batch_requests" in timings:
            self.requests_per_call.labels(model).observe(timings["batch_requests"])
        if "input_tokens" in timings:
            self.input_tokens.labels(model).inc(timings["input_tokens"])
        rows = {"samples": self.samples, "candidates": self.candidates}[task.result_rows]
        rows.labels(model).inc(len(result.scores))

    def add_constant_labels(self, **labels: str) -> None:
        """Labels every rendered sample gets, e.g. frontend="2" in a front-end process of
        `serve --frontends N`, whose scrape shows only that process's numbers."""
        self.constant_labels.update({key: str(value) for key, value in labels.items()})

    def track_model(self, model: str, inflight: Callable[[], float], queued: Callable[[], float]) -> None:
        self.inflight.labels(model).set_function(inflight)
        self.queue_depth.labels(model).set_function(queued)

    def render(self) -> bytes:
        if self.constant_labels:
            return generate_latest(_Labelled(self.registry, self.constant_labels))
        return generate_latest(self.registry)
