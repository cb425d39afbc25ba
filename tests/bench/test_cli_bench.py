"""`boundgen bench` end to end on a fake in-process engine: files written, numbers wired through."""

import json

import numpy as np
import pytest

from boundgen.artifact.program import ScoreSpec
from boundgen.cli import bench as bench_cli
from boundgen.cli.main import main
from boundgen.errors import ConfigError
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.results import ScoreResult

from tests.bench.fake_kserve_http import FakeServer


class FakeScoreEngine(Engine):
    def __init__(self):
        program = ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=15)
        self.spec = EngineSpec("fake", program, fp8_groups=("mlp",))
        self.calls, self.closed = 0, False

    def score(self, texts, deadline=None, cancelled=None):
        self.calls += 1
        return ScoreResult(np.full((len(texts), 2), 0.5, np.float32), [9693, 902],
                           timings={"pre": 1e-4, "model": 1e-3, "post": 1e-4})

    def close(self):
        self.closed = True


def test_bench_writes_json_png_markdown(tmp_path, tiny_qwen3_dir, monkeypatch, capsys):
    engine = FakeScoreEngine()
    monkeypatch.setattr(bench_cli, "_engine", lambda args, specs: (engine, "fake engine"))
    out = tmp_path / "out"
    code = main(["bench", "--workload", "W1", "--artifact", str(tiny_qwen3_dir), "--concurrency", "1,2",
                 "--duration", "0.2", "--warmup", "0.05", "--max-requests", "30", "--pool", "3",
                 "--open-loop-rate", "40", "--out", str(out)])
    assert code == 0 and engine.closed and engine.calls > 0
    result = json.loads((out / "bench_W1.json").read_text())
    assert result["workload"]["pool"] == 3 and result["workload"]["samples"] == 15
    assert result["workload"]["model_shape"]["hidden_size"] == 64  # from the checkpoint's config.json
    system = result["systems"]["boundgen"]
    assert system["error"] is None and system["fp8_groups"] == ["mlp"]
    levels = system["sweep"]["levels"]
    assert [lv["concurrency"] for lv in levels][0] == 1 and all(lv["completed"] > 0 for lv in levels)
    # A CPU engine: no device peak is known, so no effective MFU (a share of an H200's peak would mislead).
    assert levels[0]["effective_mfu"] is None and levels[0]["breakdown_ms"]["model"] == pytest.approx(1.0)
    assert system["open_loop"]["rate"] == 40.0
    assert "peer" not in result["systems"]
    assert (out / "latency_W1.png").stat().st_size > 0
    assert "### W1: score" in (out / "summary_W1.md").read_text()
    assert "### W1: score" in capsys.readouterr().out


def test_bench_records_an_engine_that_cannot_start(tmp_path, tiny_qwen3_dir, monkeypatch):
    def broken(args, specs):
        raise FileNotFoundError("no manifest.json")

    monkeypatch.setattr(bench_cli, "_engine", broken)
    assert main(["bench", "--workload", "W1", "--artifact", str(tiny_qwen3_dir), "--pool", "1",
                 "--out", str(tmp_path)]) == 1  # recorded, and the run failed: nothing was measured
    result = json.loads((tmp_path / "bench_W1.json").read_text())
    assert result["systems"]["boundgen"]["error"] == "FileNotFoundError: no manifest.json"


def test_argument_checks(tmp_path, capsys):
    assert bench_cli.parse_levels("1,2,4") == (1, 2, 4)
    assert bench_cli.parse_levels(" 1, 2") == (1, 2)
    for bad in ("4,2", "0,1", "a", "1,,2", "1,2,", ""):  # an empty level was dropped without a word
        with pytest.raises(ConfigError):
            bench_cli.parse_levels(bad)
    assert main(["bench", "--workload", "W1,W2", "--grpc", "h:1", "--model", "m", "--model-dir", "x",
                 "--out", str(tmp_path)]) == 2  # W1 and W2 are different tasks
    assert main(["bench", "--workload", "W1", "--grpc", "h:1", "--out", str(tmp_path)]) == 2  # no --model
    assert main(["bench", "--workload", "W1", "--http", "h:1", "--out", str(tmp_path)]) == 2  # no --model
    assert main(["bench", "--workload", "W1", "--artifact", "a", "--client-procs", "2",
                 "--out", str(tmp_path)]) == 2  # client processes drive a server
    assert main(["bench", "--workload", "W1", "--http", "h:1", "--model", "m", "--model-dir", "x",
                 "--client-procs", "0", "--out", str(tmp_path)]) == 2
    remote = ["--grpc", "h:1", "--model", "m", "--model-dir", "x", "--out", str(tmp_path)]
    for bad, words in ((["--workload", "W1,W1"], "names a workload twice"),
                       (["--workload", "W1", "--open-loop-rate", "abc"], "--open-loop-rate takes a positive number"),
                       (["--workload", "W1", "--open-loop-rate=-5"], "--open-loop-rate takes a positive number"),
                       (["--workload", "W1", "--duration", "0"], "--duration must be a positive number"),
                       (["--workload", "W1", "--warmup", "-1"], "--warmup must be zero or more"),
                       (["--workload", "W1", "--pool", "0"], "--pool must be at least 1"),
                       (["--workload", "W1", "--max-requests", "0"], "--max-requests must be at least 1")):
        assert main(["bench", *bad, *remote]) == 2
        assert words in capsys.readouterr().err, bad
    for bad, words in ((["--workload", "W1", "--allow-subset", "s"], "filter a constrained beam model"),
                       (["--workload", "W2", "--allow-items", "10"], "needs K >= 1 and --catalogue"),
                       (["--workload", "W2", "--catalogue", "c"], "--catalogue is for --allow-items"),
                       (["--workload", "W2", "--allow-items", "10", "--catalogue", str(tmp_path)],
                        "is not a catalogue directory")):
        assert main(["bench", *bad, *remote]) == 2
        assert words in capsys.readouterr().err, bad


def test_bench_over_http_from_client_processes(tmp_path, monkeypatch):
    """--http: the levels come from --client-procs processes, the capacity level is rerun with twice
    as many, and the result records its host. (Requests made up, no torch versions asked for, no
    plot: loading a tokenizer, importing torch and matplotlib take longer than the bench.)"""
    from boundgen.bench import report, runner, workloads

    monkeypatch.setattr(runner, "environment", lambda: {"python": "3"})
    monkeypatch.setattr(report, "plot_latency", lambda results, path: path)
    monkeypatch.setattr(workloads, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(workloads, "make_requests", lambda spec, tok, count, seed: [
        workloads.Request(i, tuple(f"text {i} {j}" for j in range(15)), (48,) * 15) for i in range(count)])
    out = tmp_path / "out"
    with FakeServer() as server:
        code = main(["bench", "--workload", "W1", "--http", server.address, "--model", "m",
                     "--model-dir", str(tmp_path), "--concurrency", "1,4", "--duration", "0.3",
                     "--warmup", "0.05", "--pool", "3", "--client-procs", "2", "--server-cores", "0-3",
                     "--out", str(out)])
    assert code == 0
    result = json.loads((out / "bench_W1.json").read_text())
    assert result["host"]["client_procs"] == 2 and result["host"]["server_cores"] == "0-3"
    system = result["systems"]["boundgen"]
    assert system["error"] is None and system["target"] == f"http {server.address} model m"
    assert system["client_procs"] == 2
    assert all(lv["completed"] > 0 and not lv["errors"] for lv in system["sweep"]["levels"])
    check = system["client_check"]
    if system["sweep"]["capacity"]["concurrency"] == 4:
        assert (check["procs"], check["procs_2x"]) == (2, 4) and check["qps_2x"] > 0
    else:  # c=1 leaves no room for a second process
        assert "skipped" in check
    summary = (out / "summary_W1.md").read_text()
    assert "Host: " in summary and "2 client processes; server cores 0-3." in summary
    assert "client check" in summary


def test_bench_peer_only_in_its_own_process(tmp_path, tiny_qwen3_dir):
    """`--peer` without a boundgen target: the eager peer in a child process, shapes warmed, paddings probed."""
    out = tmp_path / "out"
    code = main(["bench", "--workload", "W1", "--peer", str(tiny_qwen3_dir), "--peer-mode", "eager",
                 "--concurrency", "1,2", "--duration", "0.3", "--warmup", "0.05", "--max-requests", "10",
                 "--pool", "2", "--peer-max-batch", "2", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "bench_W1.json").read_text())
    assert set(result["systems"]) == {"peer_eager"}
    peer = result["systems"]["peer_eager"]
    assert peer["error"] is None and "boundgen.bench.peer_process" in peer["process"]
    assert set(peer["setup"]["probe"]) == {"bucket", "longest"} and peer["setup"]["chosen"]["max_batch"] == 2
    assert peer["setup"]["warmup_batched"]["requests_per_call"] == [2]
    assert all(lv["completed"] > 0 for lv in peer["sweep"]["levels"])
    assert "HF transformers" in peer["target"] and "up to 2 request(s) a call" in peer["target"]


def test_peer_mode_and_target_checks(tmp_path):
    assert main(["bench", "--workload", "W1", "--out", str(tmp_path)]) == 2  # nothing to measure
    assert main(["bench", "--workload", "W1", "--peer", "x", "--peer-mode", "jit", "--out", str(tmp_path)]) == 2


def test_engine_flags_override_the_artifacts_runtime(monkeypatch):
    """--contexts / --token-bucket / --tokenizer reach the artifact's loader as overrides (the A/B
    runs of the GPU scripts bench one artifact under other engine flags)."""
    import argparse

    import boundgen
    from boundgen.cli import common

    seen = {}
    monkeypatch.setattr(common, "is_artifact", lambda path: True)
    monkeypatch.setattr(boundgen, "load", lambda path, **kw: seen.update(kw) or "engine")
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["--workload", "W1", "--artifact", "art", "--contexts", "1", "--token-bucket", "128",
                              "--tokenizer", "tokenizers"])
    engine, described = bench_cli._engine(args, [])
    assert engine == "engine" and seen == {"contexts": 1, "token_bucket": 128, "fast_tokenizer": False}
    assert "token_bucket=128" in described
    seen.clear()
    bench_cli._engine(parser.parse_args(["--workload", "W1", "--artifact", "art", "--tokenizer", "fast-joined"]), [])
    assert seen == {"fast_tokenizer": True, "joined_tokenizing": True}


def test_mfu_only_against_a_known_device_peak():
    from boundgen.bench import mfu, runner
    from boundgen.bench.workloads import Request, get_workload

    assert mfu.peaks_for("NVIDIA H200") == mfu.H200_PEAKS and mfu.peaks_for("NVIDIA H100 80GB HBM3")
    assert mfu.peaks_for("cpu") is None and mfu.peaks_for("NVIDIA GeForce RTX 4090") is None
    assert mfu.peaks_for(None) is None
    spec = get_workload("W1")
    shape = mfu.SHAPES[spec.preset]
    assert runner.work_function(spec, shape, (), None) is None
    work = runner.work_function(spec, shape, (), mfu.peaks_for("NVIDIA H200"))
    assert work(Request(0, ("a",) * 15, (100,) * 15)) > 0


def test_an_artifacts_model_shape_comes_from_its_manifest(tmp_path):
    import json

    from boundgen.bench import runner
    from boundgen.bench.workloads import get_workload

    config = {"family": "qwen3", "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
              "num_kv_heads": 2, "num_layers": 2, "vocab_size": 151936}
    (tmp_path / "manifest.json").write_text(json.dumps({"model": {"config": config}}))
    shape, source = runner.model_shape(get_workload("W1"), [None, str(tmp_path)])
    assert (shape.hidden_size, shape.num_layers, source) == (64, 2, f"{tmp_path}/manifest.json")


def test_flags_the_engine_cannot_take_are_refused_before_it_loads(tmp_path, tiny_qwen3_dir, capsys):
    """--dtype int8, --device tpu: each loaded the engine first, then was recorded as a system that failed
    (exit 1, a results file saying "not measured", torch's own words for the device)."""
    for flags, words in ((["--dtype", "int8"], "--dtype must be one of"),
                         (["--device", "tpu"], "--device must be cpu")):
        assert main(["bench", "--workload", "W1", "--artifact", str(tiny_qwen3_dir), *flags,
                     "--out", str(tmp_path)]) == 2
        assert words in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written
    assert main(["bench", "--workload", "W1", "--artifact", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "nope is not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_an_artifact_of_another_task_is_refused_before_it_loads(tmp_path, constrained_build, capsys):
    art = str(constrained_build["artifact"])
    assert main(["bench", "--workload", "W1", "--artifact", art, "--out", str(tmp_path)]) == 2
    assert "workload W1 is a score workload, and " in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
