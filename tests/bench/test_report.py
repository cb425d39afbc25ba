"""Report: JSON, PNG and markdown from a result shaped like `boundgen bench` writes."""

import json

from boundgen.bench import report
from boundgen.bench.loadgen import LevelStats, Sweep


def _level(c, qps, mean, p99, mode="closed"):
    return LevelStats(mode, c if mode == "closed" else None, 120.0 if mode == "open" else None, 2.0, int(2 * qps),
                      {}, 0, qps, 15 * qps, mean, mean * 0.9, p99, p99 * 1.2,
                      {"pre": 1.0, "model": mean - 2, "post": 0.5, "queue": 0.5}, 0.2, mean < 20 and p99 < 80)


def _result(name="W1"):
    boundgen = Sweep([_level(1, 80, 12, 15), _level(2, 150, 13, 30), _level(4, 160, 25, 90)], "budget")
    peer = Sweep([_level(1, 28, 35.6, 40), _level(2, 28, 71, 80)], "growth")
    return {
        "workload": {"name": name, "task": "score", "samples": 15, "min_tokens": 48, "max_tokens": 256,
                     "labels": [" yes", " no"], "pool": 64, "seed": 0, "gflops_per_request": 2030.0},
        "date": "2026-11-29 12:00 UTC", "env": {"torch": "2.11.0", "device": "NVIDIA H200"},
        "command": "boundgen bench --workload W1", "diagnostic": {"tokens": 1024, "samples": 4, "engine_ms": 5.05,
                                                                   "node_ms": 5.0, "overhead_pct": 1.0, "note": "c=1"},
        "profiles": {"boundgen": "profile_W1_boundgen.md"},
        "systems": {"boundgen": {"target": "artifact", "sweep": boundgen.to_dict(),
                                 "open_loop": _level(None, 110, 30, 70, mode="open").to_dict(), "error": None},
                    "peer": {"target": "HF", "sweep": peer.to_dict(), "open_loop": None, "error": None}},
    }


def test_json_png_markdown(tmp_path):
    result = _result()
    path = report.write_json(tmp_path / "bench_W1.json", result)
    assert report.read_json(path) == json.loads(json.dumps(result))
    png = report.plot_latency([result], tmp_path / "latency.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = report.markdown_workload(result)
    assert "150.0 QPS at c=2 (mean 13.0, P99 30.0 ms)" in md  # capacity point of boundgen
    assert "| boundgen | c=4 | 160.0 | 2400 | 25.0 |" in md
    assert "| boundgen | open 120/s |" in md
    assert "| peer | HF | none | 28.0 |" in md  # 35.6 ms mean: no level within budget
    assert "+1.0%" in md and "profile_W1_boundgen.md" in md


def test_failed_system_and_combined_summary(tmp_path):
    a, b = _result("W1"), _result("W2")
    b["workload"].update(task="beam", width=100, steps=5, min_tokens=64)
    b["systems"]["boundgen"] = {"target": "artifact", "error": "ArtifactError: missing manifest.json"}
    paths = [report.write_json(tmp_path / f"bench_{r['workload']['name']}.json", r) for r in (a, b)]
    assert report.main([str(p) for p in paths] + ["--png", str(tmp_path / "all.png"),
                                                  "--markdown", str(tmp_path / "all.md")]) == 0
    md = (tmp_path / "all.md").read_text()
    assert md.count("`boundgen bench --workload W1`") == 1
    assert "### W1: score" in md and "### W2: beam" in md
    assert "failed: ArtifactError: missing manifest.json" in md
    assert (tmp_path / "all.png").stat().st_size > 0


def test_best_peer_and_the_comparison():
    result = _result()
    slow = Sweep([_level(1, 10, 100, 120)], "budget")
    fast = Sweep([_level(1, 60, 16, 19), _level(2, 75, 27, 40)], "budget")
    result["systems"] = {"boundgen": result["systems"]["boundgen"],
                         "peer_eager": {"target": "HF eager", "sweep": slow.to_dict(), "error": None},
                         "peer_compiled": {"target": "HF compiled", "sweep": fast.to_dict(), "error": None}}
    assert report.best_peer(result) == "peer_compiled"
    line = report.comparison(result)
    assert line == ("boundgen against the best peer of this run (peer_compiled): within the budget 150.0 vs 60.0 QPS "
                    "(2.5x); at peak 160.0 vs 75.0 QPS (2.1x).")
    assert line in report.markdown_workload(result)
    del result["systems"]["boundgen"]
    assert report.comparison(result) is None
