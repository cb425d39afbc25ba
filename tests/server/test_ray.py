"""`boundgen serve --ray`: fake-engine artifacts served by 2 Ray Serve replicas on one local Ray
instance (started by the serve process, once for this module, stopped at its end). Both replicas
serve; tritonclient gets the same answers and errors as from plain serve over HTTP and gRPC; a
burst beyond the replicas' admission gets 429; a deadline travels through Ray's proxy and is
enforced in the replica; a killed replica fails its request, the other keeps serving, and Ray
replaces it. Without Ray installed, --ray is a one-line error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from boundgen.server.deploy.launch import free_port
from tests.server.conftest import REPO
from tests.server.fake_engine import read_events, read_log

pytestmark = pytest.mark.slow  # a local Ray instance and its replicas: about a minute on 2 cores
pytest.importorskip("ray.serve")

RAY_READY_TIMEOUT_S = 240.0
TEXTS = ["a first sample", "zwei", "the third sample text"]


@pytest.fixture(scope="module")
def ray_server(launch, fake_dirs):
    """fscore and fbeam on 2 replicas: each runs 1 request per model and queues 2 more."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "RAY_DEDUP_LOGS": "0"}
    args = ["--ray", "--replicas", "2", "--cpus-per-replica", "0.5", "--http-port", str(free_port()),
            "--grpc-port", str(free_port()), "--max-inflight", "1", "--max-queue", "2",
            "--default-timeout-ms", "60000"]
    server = launch([fake_dirs["score"], fake_dirs["beam"]], args=args, env=env, wait_ready=False)
    server.wait_ready(RAY_READY_TIMEOUT_S)
    yield server
    assert server.stop(timeout_s=120) == 0
    assert any("boundgen serve: stopped" in line for line in server.output)


def client(server, protocol):
    return (thttp.InferenceServerClient(server.http_url, network_timeout=60.0) if protocol == "http"
            else tgrpc.InferenceServerClient(server.grpc_url))


def infer(server, model, texts, protocol="http", timeout_us=None):
    mod = thttp if protocol == "http" else tgrpc
    t = mod.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    kwargs = {"timeout": timeout_us} if timeout_us is not None else {}
    if protocol == "grpc":
        kwargs["client_timeout"] = 60.0
    result = client(server, protocol).infer(model, [t], **kwargs)
    names = ["SCORES"] if model == "fscore" else ["TOKEN_IDS", "SCORES", "TEXT_OUT"]
    return {name: result.as_numpy(name) for name in names}


def error_of(fn) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        fn()
    return str(err.value.status()), err.value.message()


def pids_of(log, text: str) -> set[int]:
    return {record["pid"] for record in read_log(log) if text in record["texts"]}


def test_replica_load_error_stops_serve_with_its_message(fake_dirs, tmp_path):
    """An artifact that fails to load (here: a hash mismatch) stops `serve --ray` with exit 2 and
    the loader's message, after Ray gives up restarting the replica (bounded). First in the module: its own local
    Ray instance, before the module's is up."""
    from tests.server.conftest import SCORE_SPEC
    from tests.server.fake_engine import write_fake_artifact

    broken = write_fake_artifact(tmp_path / "broken", SCORE_SPEC, load_error="model.pt2: hash mismatch (test)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.server.fake_serve", str(broken), "--ray", "--http-port",
                           str(free_port()), "--grpc-port", str(free_port())],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=RAY_READY_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Ray Serve could not start the replicas: boundgen.errors.ArtifactError: model.pt2: hash mismatch" \
        in proc.stderr, proc.stderr[-2000:]
    assert "boundgen serve: stopped" in proc.stdout


def test_both_replicas_serve(ray_server, fake_dirs):
    """Pairs of 0.2 s requests at once: while one replica runs the first, the router sends the
    second to the idle one (bounded: Ray's router may learn of the second replica late)."""
    served, end = set(), time.monotonic() + 60.0
    with ThreadPoolExecutor(2) as pool:
        while len(served) < 2 and time.monotonic() < end:
            texts = [f"which replica {uuid.uuid4().hex} sleep=0.2" for _ in range(2)]
            list(pool.map(lambda a: infer(ray_server, "fscore", [a[0]], a[1]), zip(texts, ["http", "grpc"])))
            served |= {pid for text in texts for pid in pids_of(fake_dirs["log"], text)}
    assert len(served) == 2, f"for 60 s, every request went to replica pids {served}"
    assert os.getpid() not in served


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_answers_and_errors_equal_plain_serve(ray_server, fake_server, protocol):
    for model, texts in (("fscore", TEXTS), ("fbeam", TEXTS[:1])):
        want, got = infer(fake_server, model, texts, protocol), infer(ray_server, model, texts, protocol)
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    for server in (fake_server, ray_server):  # ready, metadata and config as plain serve answers them
        c = client(server, protocol)
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("fbeam")
    meta = [client(s, protocol).get_model_metadata("fscore") for s in (fake_server, ray_server)]
    assert str(meta[0]) == str(meta[1])  # the text form: unknown fields (parameters) compare by bytes
    for bad in (lambda s: infer(s, "nope", TEXTS, protocol),  # unknown model: 400 / INVALID_ARGUMENT
                lambda s: infer(s, "fscore", ["too many words " * 4], protocol),
                lambda s: infer(s, "fscore", ["x"] * 5, protocol)):
        assert error_of(lambda: bad(ray_server)) == error_of(lambda: bad(fake_server))


def test_http_errors_are_json_as_plain_serve(ray_server, fake_server):
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answers = []
    for server in (fake_server, ray_server):
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/fscore/infer", data=b"{not json",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(request, timeout=30)
        answers.append((err.value.code, json.loads(err.value.read())))
    assert answers[0] == answers[1] and answers[0][0] == 400


def test_v1_score_equal_plain_serve(ray_server, fake_server):
    from tests.server.test_score_api import NO, YES, post

    body = {"query": "q: ", "items": ["trail runner", "desk lamp"], "label_token_ids": [YES, NO], "model": "fscore",
            "apply_softmax": True}
    answers = [post(server, body) for server in (fake_server, ray_server)]
    assert answers[0][0] == 200 and answers[0] == answers[1], answers


def test_deadline_is_enforced_in_the_replica(ray_server, fake_dirs):
    """The request's `timeout` crosses Ray's proxy: one that has passed is refused unrun, in the replica."""
    text = f"expired {uuid.uuid4().hex}"
    for protocol in ("http", "grpc"):
        status, message = error_of(lambda: infer(ray_server, "fscore", [text], protocol, timeout_us=1))
        assert status in ("504", "StatusCode.DEADLINE_EXCEEDED"), (status, message)
        assert "deadline had already passed when it arrived" in message
    assert not pids_of(fake_dirs["log"], text)  # never ran


def test_deadline_passes_while_queued_in_the_replica(ray_server, fake_dirs, tmp_path):
    """Both replicas busy: a request with 300 ms to live waits in a replica's queue and gets 504, unrun."""
    hold = tmp_path / f"release-{uuid.uuid4().hex}"
    log = fake_dirs["log"]
    with ThreadPoolExecutor(4) as pool:
        held, busy = [], set()
        for i in range(4):  # until each replica runs one held request (at most 1 + 2 queued each)
            held.append(pool.submit(infer, ray_server, "fscore", [f"held {i} hold={hold}"]))
            end = time.monotonic() + 5.0
            while time.monotonic() < end and len(busy) < min(i + 1, 2):
                busy = {r["pid"] for r in read_events(log, "started") if str(hold) in r["texts"][0]}
                time.sleep(0.02)
            if len(busy) == 2:
                break
        assert len(busy) == 2, "the held requests did not reach both replicas"
        try:
            text = f"queued {uuid.uuid4().hex}"
            status, message = error_of(lambda: infer(ray_server, "fscore", [text], timeout_us=300_000))
            assert status == "504", message
            assert "queued for model fscore; the request was not run" in message
        finally:
            hold.touch()
        assert all(f.result(timeout=60)["SCORES"].shape == (1, 2) for f in held)
    assert not pids_of(log, text)


def test_burst_beyond_admission_gets_429(ray_server, tmp_path):
    """2 replicas x (1 running + 2 queued) admit 6 held requests and 2 x 2 more may wait in Ray's
    router: of a burst of 12 (HTTP and gRPC), at least 2 are refused at once, 429 / RESOURCE_EXHAUSTED."""
    hold = tmp_path / f"release-{uuid.uuid4().hex}"
    protocols = ["http", "grpc"] * 6
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(infer, ray_server, "fscore", [f"burst {i} hold={hold}"], protocol)
                   for i, protocol in enumerate(protocols)]
        refused = []
        end = time.monotonic() + 60.0
        while len(refused) < 2 and time.monotonic() < end:
            refused = [f for f in futures if f.done()]
            time.sleep(0.05)
        hold.touch()
        outcomes = []
        for f, protocol in zip(futures, protocols):
            try:
                outcomes.append((protocol, f.result(timeout=60)["SCORES"].shape == (1, 2) and "ok"))
            except InferenceServerException as exc:
                outcomes.append((protocol, exc.status()))
                assert "decoding the response" not in exc.message()  # a JSON body, Ray's 429 too
    assert set(outcomes) <= {("http", "ok"), ("grpc", "ok"), ("http", "429"),
                             ("grpc", "StatusCode.RESOURCE_EXHAUSTED")}, outcomes
    assert sum(outcome != "ok" for _, outcome in outcomes) >= 2, outcomes
    assert len(refused) >= 2  # refused at once: while the admitted ones were still held


def test_killed_replica_fails_its_request_and_is_replaced(ray_server, fake_dirs, tmp_path):
    log = fake_dirs["log"]
    hold = tmp_path / f"release-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(infer, ray_server, "fscore", [f"doomed hold={hold}"])
        end = time.monotonic() + 30.0
        while not (started := [r for r in read_events(log, "started") if str(hold) in r["texts"][0]]):
            assert time.monotonic() < end, "the held request never started"
            time.sleep(0.02)
        victim = started[0]["pid"]
        before = {r["pid"] for r in read_log(log)}
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(InferenceServerException) as err:
            held.result(timeout=60)
    assert err.value.status() in ("500", "503"), err.value  # Ray's proxy: the actor died / ray_proxy.py's 503
    assert "decoding the response" not in err.value.message()  # a JSON error body either way (ray_proxy.py)
    survivors = set()
    for i in range(3):  # the other replica keeps serving
        text = f"after the kill {uuid.uuid4().hex}"
        infer(ray_server, "fscore", [text])
        survivors |= pids_of(log, text)
    assert victim not in survivors
    end, replaced = time.monotonic() + 120.0, set()
    while not replaced:  # Ray starts a new replica, which takes traffic
        assert time.monotonic() < end, "no new replica served within 120 s of the kill"
        text = f"replacement {uuid.uuid4().hex}"
        infer(ray_server, "fscore", [text], "grpc")
        replaced = pids_of(log, text) - before - {victim}
        time.sleep(0.1)


def test_deployment_options_follow_admission_and_flags(fake_dirs):
    """What Ray is told, checked by Ray Serve's own option validation (no Ray instance needed)."""
    from ray import serve

    from boundgen.server.config import ServerConfig
    from boundgen.server.deploy.ray_replica import Replica
    from boundgen.server.deploy.ray_serve import RayOptions, deployment_options

    dirs = [fake_dirs["score"], fake_dirs["beam"]]
    fixed = deployment_options(dirs, ServerConfig(max_inflight=2, max_queue=3), RayOptions(replicas=3))
    assert fixed["max_ongoing_requests"] == 2 * (2 + 3) and fixed["max_queued_requests"] == 3 * 3
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    scaled = deployment_options(dirs, ServerConfig(max_queue=4), RayOptions(min_replicas=2, max_replicas=5),
                                runtime={"contexts": 3})
    assert "num_replicas" not in scaled and scaled["max_ongoing_requests"] == 2 * (3 + 4)
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 5, "initial_replicas": 2,
                                            "target_ongoing_requests": 6}
    for options in (fixed, scaled):
        serve.deployment(name="Replica", **options)(Replica)  # raises on an option Ray does not take


@pytest.mark.parametrize("flags,message", [
    (["--min-replicas", "2"], "--min-replicas applies to Ray Serve only; add --ray"),
    (["--ray", "--min-replicas", "2"], "autoscaling needs both --min-replicas and --max-replicas"),
    (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "need 1 <= --min-replicas <= --max-replicas"),
    (["--ray", "--gpus", "1"], "with --ray use --replicas N and --gpus-per-replica G"),
    (["--ray", "--http-port", "0"], "--ray needs fixed ports"),
])
def test_ray_flag_errors(fake_dirs, flags, message):
    proc = subprocess.run([sys.executable, "-m", "boundgen", "serve", str(fake_dirs["score"]), *flags],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_without_ray_installed_is_one_line_error(fake_dirs, tmp_path):
    hidden = tmp_path / "no_ray" / "ray"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden.parent), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "boundgen", "serve", str(fake_dirs["score"]), "--ray"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "pip install boundgen[ray]" in proc.stderr, proc.stderr


def test_plain_serve_does_not_import_ray():
    code = ("import sys; from boundgen.cli.main import make_parser; import boundgen.server.app, "
            "boundgen.server.deploy.replicas; make_parser(); print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
