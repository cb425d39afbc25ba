"""Profile: trace analysis on a hand-made trace; a CPU profile through worker threads."""

import torch

from boundgen.bench.profile import analyze_trace, profile_markdown, profile_requests


def _k(name, ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_analyze_trace_by_hand():
    trace = {"traceEvents": [
        _k("gemm", 0, 10, 7), _k("softmax", 15, 10, 7), _k("gemm", 25, 5, 7), _k("topk", 5, 15, 8),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 40, "dur": 2, "args": {"stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},
    ]}
    s = analyze_trace(trace)
    assert s["kernels"] == 4
    assert s["gpu_window_ms"] * 1e3 == 42  # 0 .. 42 us
    assert s["gpu_busy_ms"] * 1e3 == 32  # [0, 30] and [40, 42]
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "topk", "softmax"]
    assert s["top_kernels"][0]["count"] == 2 and s["top_kernels"][0]["total_ms"] * 1e3 == 15
    st7 = s["streams"]["7"]  # gaps: 10->15 = 5, 25->25 = 0, 30->40 = 10
    assert st7["ops"] == 4 and st7["gap_total_ms"] * 1e3 == 15 and st7["gap_max_us"] == 10
    assert st7["gaps_over_10us"] == 0
    assert s["streams"]["8"]["gap_total_ms"] == 0
    assert "| `gemm` | 2 | 0.01 |" in profile_markdown("t", s)


def test_profile_requests_records_worker_thread_ops(tmp_path):
    a = torch.randn(64, 64)

    def target(req):
        return a @ a

    s = profile_requests(target, list(range(3)), concurrency=2, n_requests=6, trace_path=tmp_path / "t.json.gz")
    assert s["requests"] >= 6 and not s["errors"]
    assert any(op["name"] in ("aten::mm", "aten::matmul") for op in s["top_cpu_ops"])
    assert (tmp_path / "t.json.gz").stat().st_size > 0
    assert "CPU op" in profile_markdown("cpu", s)
