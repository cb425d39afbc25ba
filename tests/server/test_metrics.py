"""Metrics that mean what they say: seconds histograms hold seconds only (the requests sharing a
call go to their own histogram), tokens, samples and candidates are counted, GPU memory is
reported only where CUDA is initialised, and a front end's scrape can carry a constant label."""

from __future__ import annotations

import sys
import types
import urllib.request

import numpy as np
import tritonclient.http as thttp
from prometheus_client.parser import text_string_to_metric_families

from boundgen.artifact.tasks import TASKS
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.server.metrics import ServerMetrics
from tests.server.test_endpoints import text_input

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label pairs): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(server) -> dict[tuple, float]:
    with NO_PROXY.open(f"http://{server.http_url}/metrics", timeout=10) as r:
        return samples(r.read().decode())


def test_counts_are_not_seconds_and_work_is_counted(fake_server):
    before = scrape(fake_server)
    c = thttp.InferenceServerClient(fake_server.http_url)
    c.infer("fscore", [text_input("http", ["one two three", "four five"])])
    c.infer("fbeam", [text_input("http", ["a prompt"])])
    after = scrape(fake_server)

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert not any(name == "boundgen_engine_stage_seconds_count" and dict(labels).get("stage") == "batch_requests"
                   for name, labels in after), "a request count is not seconds"
    assert grew("boundgen_engine_stage_seconds_count", model="fscore", stage="model") == 1
    assert grew("boundgen_requests_per_call_bucket", model="fscore", le="1.0") == 1  # alone in its call
    assert grew("boundgen_requests_per_call_count", model="fscore") == 1
    assert grew("boundgen_input_tokens_total", model="fscore") == 5  # the fake engine's tokens are words
    assert grew("boundgen_input_tokens_total", model="fbeam") == 2
    assert grew("boundgen_samples_total", model="fscore") == 2
    assert grew("boundgen_candidates_total", model="fbeam") == 3  # BEAM_SPEC's width
    assert not any(name.startswith("boundgen_gpu_memory") for name, _ in after)  # no CUDA in this process


def test_observe_result_routes_each_timing():
    m = ServerMetrics()
    result = ScoreResult(np.zeros((3, 2), np.float32), [1, 2], {"pre": 0.001, "queue": 0.002, "model": 0.004,
                                                                "batch_requests": 6, "input_tokens": 40,
                                                                "post": 0.0005, "total": 0.008})
    m.observe_result("s", result, TASKS["score"])
    m.observe_result("b", BeamResult(np.zeros((4, 2), np.int32), np.zeros(4, np.float32), np.zeros(4, bool),
                                     ["x"] * 4, {}), TASKS["beam"])
    got = samples(m.render().decode())
    stages = {dict(labels)["stage"] for name, labels in got if name == "boundgen_engine_stage_seconds_count"}
    assert stages == {"pre", "queue", "model", "post"}
    assert got[("boundgen_requests_per_call_bucket", (("le", "4.0"), ("model", "s")))] == 0
    assert got[("boundgen_requests_per_call_bucket", (("le", "6.0"), ("model", "s")))] == 1
    assert got[("boundgen_input_tokens_total", (("model", "s"),))] == 40
    assert got[("boundgen_samples_total", (("model", "s"),))] == 3
    assert got[("boundgen_candidates_total", (("model", "b"),))] == 4
    assert ("boundgen_input_tokens_total", (("model", "b"),)) not in got  # not reported: not counted


def test_a_front_end_labels_its_own_samples():
    m = ServerMetrics()
    m.observe_request("s", "http", "success", 0.01)
    m.add_constant_labels(frontend=2)
    got = samples(m.render().decode())
    assert got[("boundgen_requests_total", (("frontend", "2"), ("model", "s"), ("outcome", "success"),
                                            ("protocol", "http")))] == 1
    assert all(dict(labels).get("frontend") == "2" for _, labels in got)
    assert m.phase_totals("s")["success"][0] == 1  # read back unlabelled


def test_gpu_memory_is_read_where_cuda_is_initialised(monkeypatch):
    cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 2,
                                 memory_allocated=lambda i: 1000 * (i + 1), memory_reserved=lambda i: 4096 * (i + 1))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    got = samples(ServerMetrics().render().decode())
    assert got[("boundgen_gpu_memory_allocated_bytes", (("device", "cuda:1"),))] == 2000
    assert got[("boundgen_gpu_memory_reserved_bytes", (("device", "cuda:0"),))] == 4096
    cuda.is_initialized = lambda: False
    assert not any(name.startswith("boundgen_gpu") for name, _ in samples(ServerMetrics().render().decode()))
