"""The call-cost curve runs the engine's program on R copies of a request in one call."""

import pytest

from boundgen.artifact.program import BeamSpec
from boundgen.bench.calls import call_curve, markdown
from boundgen.programs.eager import eager_engine


def test_call_curve_stops_at_the_call_bounds(tiny_qwen2_dir):
    engine = eager_engine(tiny_qwen2_dir, BeamSpec(width=3, steps=2, max_prompt_tokens=16, max_requests=4))
    try:
        rows = call_curve(engine, ["query: running shoes"], requests=(1, 2, 4, 8), iterations=2, warmup=1)
        assert [r["requests"] for r in rows] == [1, 2, 4]  # 8 prompts do not fit one call
        assert all(r["call_ms"] > 0 and r["request_ms"] == pytest.approx(r["call_ms"] / r["requests"]) for r in rows)
        assert rows[0]["speedup"] == pytest.approx(1.0)
        assert "| 4 |" in markdown(rows, "W2")
        with pytest.raises(ValueError, match="exceed one call's bounds"):
            engine.program_call(["x"], copies=5)
    finally:
        engine.close()


def test_per_call_figures_come_from_the_profile_of_several_calls():
    from boundgen.bench.calls import per_call
    from boundgen.bench.profile import analyze_trace

    # two calls of three kernels each, the second kernel of each overlapping the first by 1 us
    events = []
    for start in (0.0, 100.0):
        events += [{"ph": "X", "cat": "kernel", "name": "k", "ts": start + t, "dur": d}
                   for t, d in ((0.0, 5.0), (4.0, 6.0), (20.0, 10.0))]
    events[2]["name"] = events[5]["name"] = "long"
    figures = per_call(analyze_trace({"traceEvents": events}), 2)
    assert figures["kernels_per_call"] == 3.0 and figures["gpu_ms_per_call"] == pytest.approx(0.020)  # 10 + 10 us
    assert figures["top_kernels"] == [  # by GPU time, per call
        {"name": "k", "launches_per_call": 2.0, "us_per_call": pytest.approx(11.0), "mean_us": pytest.approx(5.5)},
        {"name": "long", "launches_per_call": 1.0, "us_per_call": pytest.approx(10.0), "mean_us": pytest.approx(10.0)}]
    rows = [{"requests": 1, "call_ms": 1.0, "request_ms": 1.0, "speedup": 1.0, **figures}]
    table = markdown(rows, "W2")
    assert "| 1 | 1.00 | 1.00 | 1.00x | 3 | 0.02 |" in table
    assert "Kernels of a call of 1 requests" in table and "| `k` | 2 | 11.0 | 5.5 |" in table
