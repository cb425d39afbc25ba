"""Lifecycle: live at once, ready only after load + warm-up, SIGTERM drains and exits 0;
the optional API key; start-up errors."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.server.conftest import REPO, SCORE_SPEC, wait_metric
from tests.server.fake_engine import write_fake_artifact
from tests.server.test_endpoints import NO_PROXY, text_input


def status_of(server, path, headers=None):
    import urllib.request

    request = urllib.request.Request(f"http://{server.http_url}{path}", headers=headers or {})
    try:
        with NO_PROXY.open(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def ready_body(server):
    """GET /v2/health/ready's status and JSON body."""
    try:
        with NO_PROXY.open(f"http://{server.http_url}/v2/health/ready", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def infer(protocol, server, text, headers=None):
    mod = thttp if protocol == "http" else tgrpc
    t = mod.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    c = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    return c.infer("fscore", [t], headers=headers)


def test_ready_only_after_warmup(launch, tmp_path):
    gate = tmp_path / "warmup-may-finish"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, gate=gate)], wait_ready=False)
    assert status_of(server, "/v2/health/live") == 200
    assert ready_body(server) == (503, {"ready": False})
    assert status_of(server, "/v2/models/fscore/ready") == 503
    assert tgrpc.InferenceServerClient(server.grpc_url).is_server_ready() is False
    assert tgrpc.InferenceServerClient(server.grpc_url).is_model_ready("fscore") is False
    with pytest.raises(InferenceServerException) as http_err:
        infer("http", server, "too early")
    assert http_err.value.status() == "503"
    with pytest.raises(InferenceServerException) as grpc_err:
        infer("grpc", server, "too early")
    assert grpc_err.value.status() == "StatusCode.UNAVAILABLE"
    gate.touch()
    server.wait_ready(30.0)
    assert ready_body(server) == (200, {"ready": True})
    assert infer("grpc", server, "now").as_numpy("SCORES").shape == (1, 2)
    assert server.stop() == 0


def test_sigterm_while_loading_exits_0(launch, tmp_path):
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, gate=tmp_path / "never")], wait_ready=False)
    assert status_of(server, "/v2/health/ready") == 503
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_drains_admitted_requests_and_exits_0(launch, tmp_path, stop):
    """SIGTERM, and SIGHUP (a closed terminal: it killed the server undrained before)."""
    log = tmp_path / "calls.jsonl"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=log)],
                    args=["--max-inflight", "1", "--max-queue", "2", "--default-timeout-ms", "30000"])
    release = tmp_path / f"release-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(infer, "http", server, f"hold={release}")
        wait_metric(server, 'boundgen_inflight_requests{model="fscore"}', 1)
        queued = pool.submit(infer, "grpc", server, "queued at SIGTERM")
        wait_metric(server, 'boundgen_queue_depth{model="fscore"}', 1)
        server.proc.send_signal(stop)
        for _ in range(1000):  # bounded: ready turns 503 once draining
            if status_of(server, "/v2/health/ready") == 503:
                break
            time.sleep(0.01)
        assert ready_body(server) == (503, {"ready": False})
        assert status_of(server, "/v2/health/live") == 200
        with pytest.raises(InferenceServerException) as http_err:
            infer("http", server, "after SIGTERM")
        assert http_err.value.status() == "503" and "shutting down" in http_err.value.message()
        with pytest.raises(InferenceServerException) as grpc_err:
            infer("grpc", server, "after SIGTERM")
        assert grpc_err.value.status() == "StatusCode.UNAVAILABLE"
        release.touch()
        assert running.result(30).as_numpy("SCORES").shape == (1, 2)
        assert queued.result(30).as_numpy("SCORES").shape == (1, 2)
    assert server.proc.wait(30) == 0
    assert "draining" in "".join(server.output)


def test_api_key(launch, fake_dirs):
    env = {**os.environ, "BOUNDGEN_API_KEY": "s3cret"}
    server = launch([fake_dirs["score"]], env=env)
    good, bad = {"Authorization": "Bearer s3cret"}, {"Authorization": "Bearer wrong"}
    assert status_of(server, "/v2/health/live") == 200 and status_of(server, "/v2/health/ready") == 200
    for path in ("/v2", "/v2/models/fscore", "/v2/models/fscore/ready", "/v2/models/fscore/config",
                 "/v2/models/stats", "/metrics", "/v2/logging", "/v2/trace/setting", "/v2/cudasharedmemory/status"):
        assert status_of(server, path) == 401, path
        assert status_of(server, path, bad) == 401, path
        assert status_of(server, path, good) == 200, path
    with pytest.raises(InferenceServerException) as err:
        infer("http", server, "no key")
    assert err.value.status() == "401"
    assert infer("http", server, "key", headers=good).as_numpy("SCORES").shape == (1, 2)

    grpc_client = tgrpc.InferenceServerClient(server.grpc_url)
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    with pytest.raises(InferenceServerException) as err:
        grpc_client.get_model_metadata("fscore")
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as err:
        infer("grpc", server, "wrong key", headers={"authorization": "Bearer wrong"})
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    grpc_good = {"authorization": "Bearer s3cret"}
    assert grpc_client.get_model_metadata("fscore", headers=grpc_good).name == "fscore"
    for call in (grpc_client.get_log_settings, grpc_client.get_trace_settings,
                 grpc_client.get_cuda_shared_memory_status):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == "StatusCode.UNAUTHENTICATED"
        call(headers=grpc_good)
    answers = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put(error))  # refused as it opens
    assert answers.get(timeout=30).status() == "StatusCode.UNAUTHENTICATED"
    grpc_client.stop_stream()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=grpc_good)
    grpc_client.async_stream_infer("fscore", [text_input("grpc", ["key"])])
    result, error = answers.get(timeout=30)
    assert error is None and result.as_numpy("SCORES").shape == (1, 2)
    grpc_client.stop_stream()
    assert infer("grpc", server, "key", headers=grpc_good).as_numpy("SCORES").shape == (1, 2)
    assert server.stop() == 0


def test_startup_errors_exit_2(tmp_path, fake_dirs):
    def serve(*args):
        return subprocess.run([sys.executable, "-m", "tests.server.fake_serve", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    missing = serve(str(tmp_path / "missing"), "--http-port", "0", "--grpc-port", "0")
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    same = serve(str(fake_dirs["score"]), str(fake_dirs["score"]), "--http-port", "0", "--grpc-port", "0")
    assert same.returncode == 2 and "both named 'fscore'" in same.stderr
    bad_flag = serve(str(fake_dirs["score"]), "--max-queue", "-1")
    assert bad_flag.returncode == 2 and "max_queue" in bad_flag.stderr
    bad_hold = serve(str(fake_dirs["score"]), "--refusal-hold-ms", "-5")
    assert bad_hold.returncode == 2 and "refusal_hold_ms must be from 0 to 10000" in bad_hold.stderr
    for hang in ("-1", "nan", "inf", "0.3"):
        bad_hang = serve(str(fake_dirs["score"]), "--frontend-hang-s", hang)
        assert bad_hang.returncode == 2 and "frontend_hang_s must be 0 (never) or a number of seconds >= 3" \
            in bad_hang.stderr
    bad_key = serve(str(fake_dirs["score"]), "--client-key", "header")
    assert bad_key.returncode == 2 and "--client-key: invalid choice: 'header'" in bad_key.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = serve(str(fake_dirs["score"]), "--http-port", str(taken.getsockname()[1]), "--grpc-port", "0")
    assert busy.returncode == 2 and "cannot listen for HTTP" in busy.stderr


def test_background_server_in_process(fake_dirs):
    """The in-process variant (demo, bench, notebooks): same server on a thread of this process."""
    import io

    from boundgen.server.app import BackgroundServer
    from boundgen.server.config import ServerConfig
    from tests.server.fake_engine import FakeEngine

    out = io.StringIO()
    server = BackgroundServer([fake_dirs["score"]], ServerConfig(http_port=0, grpc_port=0),
                              engine_factory=FakeEngine.from_dir, out=out)
    with server:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            mod = thttp if protocol == "http" else tgrpc
            t = mod.InferInput("TEXT", [1], "BYTES")
            t.set_data_from_numpy(np.array([b"in process"], dtype=object))
            assert mod.InferenceServerClient(url).infer("fscore", [t]).as_numpy("SCORES").shape == (1, 2)
    assert server.exit_code == 0 and "stopped" in out.getvalue()


def test_replica_workers_hold_refusals_as_long_as_their_front_end_says():
    """--replicas / --gpus workers admit (each its own queue): they get the front end's hold."""
    import argparse

    from boundgen.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    for given, passed in (([], "100.0"), (["--refusal-hold-ms", "250"], "250.0"), (["--refusal-hold-ms", "0"], "0.0")):
        out = serve_cli.worker_args(parser.parse_args(["serve", "unused", *given]))
        assert out[out.index("--refusal-hold-ms") + 1] == passed


def test_grpc_calls_in_its_intake_at_sigterm_are_answered_unavailable(launch, tmp_path):
    """300 calls on one channel, SIGTERM just after: grpc.aio hands calls to Python one a turn of the event
    loop, so most still waited in gRPC's intake when the drain ended, and gRPC's stop cancelled them
    (CANCELLED, unlogged: 38-252 of 300 before). Each is answered now, OK or UNAVAILABLE."""
    import asyncio

    import grpc

    from boundgen.server.kserve import pb

    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, sleep_s=0.003)],
                    args=["--max-queue", "1000"])

    async def burst() -> list[str]:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            await channel.channel_ready()
            call = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer",
                                       request_serializer=pb.ModelInferRequest.SerializeToString,
                                       response_deserializer=pb.ModelInferResponse.FromString)
            request = pb.ModelInferRequest(model_name="fscore")
            request.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hello")

            async def one() -> str:
                try:
                    await call(request, timeout=30)
                    return "OK"
                except grpc.RpcError as exc:
                    return exc.code().name

            calls = [asyncio.ensure_future(one()) for _ in range(300)]
            await asyncio.sleep(0.001)
            server.proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*calls)

    ends = asyncio.run(burst())
    assert server.proc.wait(30) == 0
    assert set(ends) <= {"OK", "UNAVAILABLE"}, {end: ends.count(end) for end in set(ends)}
