"""`boundgen serve --contexts / --batching / --cuda-graphs / --token-bucket / --batch-wait-ms /
--batch-wait-learned`: the manifest's RuntimeConfig overridden without a rebuild, in the server and in
every --replicas worker. The fake engine logs the overrides its factory got, as `boundgen.load` gets them."""

from __future__ import annotations

import subprocess

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from tests.server.conftest import FAKE_SERVE, REPO, SCORE_SPEC
from tests.server.fake_engine import read_events, write_fake_artifact


def _score_once(server) -> tuple[int, ...]:
    t = thttp.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"hello"], dtype=object))
    return thttp.InferenceServerClient(server.http_url).infer("fscore", [t]).as_numpy("SCORES").shape


def test_flags_reach_the_engine_factory(launch, tmp_path):
    log = tmp_path / "calls.jsonl"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=log)],
                    args=["--contexts", "3", "--no-batching", "--cuda-graphs", "--token-bucket", "64",
                          "--batch-wait-ms", "2.5", "--batch-wait-learned"])
    assert [e["runtime"] for e in read_events(log, "loaded")] == [
        {"contexts": 3, "batching": False, "cuda_graphs": True, "token_bucket": 64, "batch_wait_ms": 2.5,
         "batch_wait_learned": True}]
    config = tgrpc.InferenceServerClient(server.grpc_url).get_model_config("fscore").config
    assert [g.count for g in config.instance_group] == [3]  # the engine's contexts
    assert "max in flight 3" in "".join(server.output)  # admission follows the engine's new concurrency
    assert _score_once(server) == (1, 2)
    assert server.stop() == 0


def test_no_flags_load_as_built(launch, tmp_path):
    log = tmp_path / "calls.jsonl"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=log)])
    assert [e["runtime"] for e in read_events(log, "loaded")] == [{}]
    assert server.stop() == 0


def test_replica_workers_get_the_same_flags(launch, tmp_path):
    log = tmp_path / "calls.jsonl"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=log)],
                    args=["--replicas", "2", "--contexts", "2", "--batching", "--no-cuda-graphs",
                          "--batch-wait-ms", "5"])
    loaded = read_events(log, "loaded")  # the front end loads no engine of its own: one per worker
    assert [e["runtime"] for e in loaded] == [
        {"contexts": 2, "batching": True, "cuda_graphs": False, "batch_wait_ms": 5.0}] * 2
    assert _score_once(server) == (1, 2)
    assert server.stop() == 0


def test_bad_values_are_refused_before_serving(tmp_path):
    artifact = write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)
    # The flags are generated from RuntimeConfig and checked by its own rules (the same words as a
    # deploy file's or a manifest's bad value).
    for flag, value, says in (("--contexts", "0", "contexts must be an integer >= 1, got 0"),
                              ("--token-bucket", "many", "expected an integer, got 'many'"),
                              ("--executors", "-2", "executors must be an integer >= 1, got -2")):
        proc = subprocess.run([*FAKE_SERVE, str(artifact), flag, value, "--http-port", "0", "--grpc-port", "0"],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 2 and f"{flag}: {says}" in proc.stderr, proc.stderr
    for value in ("-1", "21", "nan", "soon"):
        proc = subprocess.run([*FAKE_SERVE, str(artifact), "--batch-wait-ms", value, "--http-port", "0",
                               "--grpc-port", "0"], capture_output=True, text=True, timeout=60, cwd=REPO)
        says = "expected a number, got 'soon'" if value == "soon" else "batch_wait_ms must be a number of ms from 0 to 20"
        assert proc.returncode == 2 and f"--batch-wait-ms: {says}" in proc.stderr, proc.stderr
