"""Server test fixtures: fake artifacts, server processes on loopback (always killed), clients.

Every server is a real `boundgen serve` process (through tests/server/fake_serve.py, which only
swaps the engine factory) on free ports it picks itself; start-up is bounded by READY_TIMEOUT_S.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.runtime.engine import EngineSpec
from boundgen.server.deploy.launch import ServerProcess
from tests.server.fake_engine import write_fake_artifact

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
FAKE_SERVE = [sys.executable, "-m", "tests.server.fake_serve"]

SCORE_SPEC = EngineSpec("fscore", ScoreSpec(labels=(" yes", " no"), label_token_ids=(9693, 902), max_samples=4,
                                           max_tokens_per_sample=8, max_total_tokens=32))
BEAM_SPEC = EngineSpec("fbeam", BeamSpec(width=3, steps=2, max_prompt_tokens=8))


@pytest.fixture(scope="session")
def launch(tmp_path_factory):
    """launch(dirs, args=(), env=None, wait_ready=True, command=FAKE_SERVE) -> a started ServerProcess,
    killed at the end of the session if the test did not stop it."""
    started: list[ServerProcess] = []

    def start(dirs, args=(), env=None, wait_ready=True, command=FAKE_SERVE):
        server = ServerProcess(dirs, args=list(args), command=command, env=env, cwd=REPO,
                               ready_timeout_s=READY_TIMEOUT_S)
        started.append(server)
        return server.start(wait_ready=wait_ready)

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def fake_dirs(tmp_path_factory):
    """Fake score and beam artifacts without sleep, and the log their engines write."""
    root = tmp_path_factory.mktemp("fake")
    log = root / "calls.jsonl"
    return {"score": write_fake_artifact(root / "fscore", SCORE_SPEC, log=log),
            "beam": write_fake_artifact(root / "fbeam", BEAM_SPEC, log=log), "log": log, "root": root}


@pytest.fixture(scope="session")
def fake_server(launch, fake_dirs):
    """One shared server for endpoint and bad-input tests (64 KiB body limit)."""
    server = launch([fake_dirs["score"], fake_dirs["beam"]], args=["--max-body-bytes", "65536",
                                                                   "--max-inflight", "2"])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def one_slot(launch, tmp_path_factory):
    """A fake score server with one in-flight slot and one queue place (a module's own); `.log`
    lists the calls its engine made, `.root` is a folder for the test's files."""
    root = tmp_path_factory.mktemp("one_slot")
    log = root / "calls.jsonl"
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC, log=log)],
                    args=["--max-inflight", "1", "--max-queue", "1", "--default-timeout-ms", "30000"])
    server.log, server.root = log, root
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def shm_server(launch, tmp_path_factory):
    """A fake score and beam server with client shared memory on (a module's own)."""
    root = tmp_path_factory.mktemp("shm")
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC), write_fake_artifact(root / "fbeam", BEAM_SPEC)],
                    args=["--allow-client-shm"])
    yield server
    assert server.stop() == 0


INFLIGHT = 'boundgen_inflight_requests{model="fscore"}'
QUEUED = 'boundgen_queue_depth{model="fscore"}'


def metric(server, key: str, api_key: str | None = None) -> float:
    """The value of one sample line of /metrics, e.g. 'boundgen_queue_depth{model="fscore"}' (`api_key`:
    the server's, when it has one)."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with opener.open(urllib.request.Request(f"http://{server.http_url}/metrics", headers=headers), timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_metric(server, key: str, value: float, timeout_s: float = 10.0) -> None:
    """Poll /metrics until `key` equals `value` (bounded)."""
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if metric(server, key) == value:
            return
        time.sleep(0.01)
    raise AssertionError(f"{key} did not reach {value} within {timeout_s} s (now {metric(server, key)})")


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy from the environment


def post_json(server, route: str, body) -> tuple[int, dict]:
    """POST `body` (JSON-encoded unless bytes) to the server's HTTP `route`; (status, JSON answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http_url}{route}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
