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
