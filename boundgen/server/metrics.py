"""Prometheus metrics served at GET /metrics, in a registry of the server's own.

    boundgen_requests_total{model,protocol,outcome}      counter; outcome is one of status.py's
                                                         (success, invalid_input, rejected,
                                                         deadline_exceeded, unavailable,
                                                         unauthenticated, cancelled, read_timeout,
                                                         internal_error)
    boundgen_request_seconds{model,protocol}             histogram, end to end inside the server
    boundgen_queue_seconds{model}                        histogram, wait for an in-flight slot
    boundgen_compute_seconds{model}                      histogram, engine call on the worker thread
    boundgen_engine_stage_seconds{model,stage}           histogram, the engine's own timings
                                                         (pre, model, post, context_wait)
    boundgen_inflight_requests{model}                    gauge
    boundgen_queue_depth{model}                          gauge
    boundgen_ready                                       gauge, 1 once loaded and warmed up, 0 while draining

`model` is "" for requests naming no known model, so that clients cannot grow the label set.

`phase_totals(model)` reads the same metrics back as cumulative (count, seconds) per phase, for
Triton's statistics extension (triton_extensions.py); only the split of end-to-end time into
successes and failures is kept beside them, since the request histogram has no outcome label.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# Seconds; dense around the latency budget (mean < 20 ms, P99 < 80 ms).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.08, 0.1,
                   0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


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
        self.inflight = Gauge("boundgen_inflight_requests", "Requests running on the engine", ["model"], registry=r)
        self.queue_depth = Gauge("boundgen_queue_depth", "Requests waiting for an in-flight slot", ["model"],
                                 registry=r)
        self.ready = Gauge("boundgen_ready", "1 when the server is ready for inference", registry=r)
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

    def observe_stages(self, model: str, timings: dict[str, float]) -> None:
        for stage, seconds in timings.items():
            if stage != "total":
                self.stage_seconds.labels(model, stage).observe(seconds)

    def track_model(self, model: str, inflight: Callable[[], float], queued: Callable[[], float]) -> None:
        self.inflight.labels(model).set_function(inflight)
        self.queue_depth.labels(model).set_function(queued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
