"""Repository load (server/kserve/repository.py): with --model-repository DIR, tritonclient's load_model
replaces a served model by the artifact in DIR/NAME without a restart, under concurrent load over
HTTP and gRPC, and no request is lost: a request the old engine admitted finishes there, and the
load answers only once it has; everything else the policy refuses is a clean 400 / error status.

Versions are told apart by their outputs: v1 has 2 labels, v2 3, so an answer's SCORES width
says which engine ran it. The served DIR/fscore is a symlink switched atomically between them,
as docs/serving.md tells operators to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from boundgen.artifact.program import ScoreSpec
from boundgen.runtime.engine import EngineSpec
from tests.server.conftest import REPO, SCORE_SPEC, post_json
from tests.server.fake_engine import read_events, wait_for_event, write_fake_artifact
from tests.server.real import eager_engine_from_config, write_eager_artifact

V2_SPEC = EngineSpec("fscore", ScoreSpec(labels=(" yes", " no", " maybe"), label_token_ids=(9693, 902, 1234),
                                         max_samples=4, max_tokens_per_sample=8, max_total_tokens=32))
CLIENTS = 4  # two over HTTP, two over gRPC
WAIT_S = 60.0


def switch(link, target) -> None:
    """Point the symlink `link` at `target` atomically (a rename over it)."""
    tmp = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def infer_width(client, mod, texts) -> int:
    t = mod.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    return client.infer("fscore", [t]).as_numpy("SCORES").shape[1]


class Traffic:
    """CLIENTS threads sending requests back to back until stopped; each records the SCORES width
    of every answer, in order, and every error."""

    def __init__(self, server):
        self.server, self.stop = server, threading.Event()
        self.widths: list[list[int]] = [[] for _ in range(CLIENTS)]
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _run(self, i: int) -> None:
        mod = thttp if i % 2 == 0 else tgrpc
        client = mod.InferenceServerClient(self.server.http_url if mod is thttp else self.server.grpc_url)
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.widths[i].append(infer_width(client, mod, [f"client {i} request {n}", "b"]))
            except Exception as exc:  # recorded: the test fails on any
                self.errors.append(f"client {i} request {n}: {exc}")

    def start(self) -> "Traffic":
        for t in self.threads:
            t.start()
        return self

    def wait_answers(self, width: int, count: int) -> None:
        """Until every client has had `count` more answers of `width` than now (bounded)."""
        want = [sum(1 for w in ws if w == width) + count for ws in self.widths]
        end = time.monotonic() + WAIT_S
        while any(sum(1 for w in ws if w == width) < n for ws, n in zip(self.widths, want)):
            assert not self.errors, self.errors[:3]
            assert time.monotonic() < end, f"clients did not get {count} answers of width {width} within {WAIT_S} s"
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in self.threads)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    log = tmp_path / "calls.jsonl"
    v1 = write_fake_artifact(tmp_path / "versions" / "v1", SCORE_SPEC, sleep_s=0.005, log=log)
    v2 = write_fake_artifact(tmp_path / "versions" / "v2", V2_SPEC, sleep_s=0.005, log=log)
    os.symlink(v1, root / "fscore")
    return {"root": root, "link": root / "fscore", "v1": v1, "v2": v2, "log": log, "tmp": tmp_path}


def test_rolling_replace_under_load_loses_no_request(launch, repo):
    server = launch([repo["link"]], args=["--model-repository", str(repo["root"]), "--max-inflight", "4",
                                          "--max-queue", "64", "--default-timeout-ms", "30000"])
    traffic = Traffic(server).start()
    try:
        traffic.wait_answers(2, 3)
        # One request held inside the v1 engine across the replace: it must finish there, and the
        # load must not answer before it has (the old engine is drained, then closed).
        hold = repo["tmp"] / "release"
        held: dict = {}
        held_thread = threading.Thread(target=lambda: held.update(
            width=infer_width(thttp.InferenceServerClient(server.http_url), thttp, [f"hold={hold}"])), daemon=True)
        held_thread.start()
        wait_for_event(repo["log"], f"hold={hold}", "started", WAIT_S)
        switch(repo["link"], repo["v2"])
        loaded: dict = {}
        loader = threading.Thread(target=lambda: loaded.update(
            answer=thttp.InferenceServerClient(server.http_url, network_timeout=WAIT_S).load_model("fscore")),
            daemon=True)
        loader.start()
        traffic.wait_answers(3, 3)  # every client is on v2 while the old engine still holds a request
        assert loader.is_alive() and held_thread.is_alive(), "the load answered before the old engine drained"
        hold.touch()
        held_thread.join(WAIT_S)
        loader.join(WAIT_S)
        assert held == {"width": 2} and "answer" in loaded
        # Back to v1 over gRPC, still under load.
        switch(repo["link"], repo["v1"])
        tgrpc.InferenceServerClient(server.grpc_url).load_model("fscore", client_timeout=WAIT_S)
        traffic.wait_answers(2, 3)
    finally:
        traffic.finish()
    assert not traffic.errors, traffic.errors[:5]
    for widths in traffic.widths:  # each client: v1, then v2, then v1 again, never mixed
        phases = [w for i, w in enumerate(widths) if i == 0 or widths[i - 1] != w]
        assert phases == [2, 3, 2], phases
    assert len(read_events(repo["log"], "loaded")) == 3  # the first load, then one per replace
    assert server.stop() == 0
    said = server.tail(200)
    assert said.count("replacing the one served") == 2 and said.count("the replaced fscore drained and closed") == 2



def test_a_load_whose_requester_leaves_still_completes(launch, repo):
    """A gRPC load whose deadline passes while the old engine drains: the load goes on, the request
    held in the old engine is answered by it (not closed under it), and v2 serves."""
    server = launch([repo["link"]], args=["--model-repository", str(repo["root"]), "--max-inflight", "2",
                                          "--default-timeout-ms", "30000"])
    client = thttp.InferenceServerClient(server.http_url)
    hold = repo["tmp"] / "release"
    held: dict = {}
    held_thread = threading.Thread(target=lambda: held.update(width=infer_width(  # a client of its own thread
        thttp.InferenceServerClient(server.http_url), thttp, [f"hold={hold}"])), daemon=True)
    held_thread.start()
    wait_for_event(repo["log"], f"hold={hold}", "started", WAIT_S)
    switch(repo["link"], repo["v2"])
    with pytest.raises(InferenceServerException) as err:  # the load cannot end before the held request does
        tgrpc.InferenceServerClient(server.grpc_url).load_model("fscore", client_timeout=1.0)
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    end = time.monotonic() + WAIT_S
    while infer_width(client, thttp, ["which version"]) != 3:
        assert time.monotonic() < end, "v2 never served"
        time.sleep(0.01)
    hold.touch()
    held_thread.join(WAIT_S)
    assert held == {"width": 2}
    assert server.stop() == 0
    assert "the replaced fscore drained and closed" in server.tail(50)

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_index_lists_the_repositorys_unserved_artifacts(launch, repo, protocol):
    """As Triton lists a repository: served models READY, the other artifacts of DIR UNAVAILABLE
    until loaded; directories without a manifest and names a load cannot take are not listed."""
    write_fake_artifact(repo["root"] / "other", EngineSpec("other", SCORE_SPEC.program))
    (repo["root"] / "other" / "manifest.json").write_text("{}")  # listed by its presence, read by a load
    (repo["root"] / "notes").mkdir()
    (repo["root"] / ".hidden").mkdir()
    (repo["root"] / ".hidden" / "manifest.json").write_text("{}")
    server = launch([repo["link"]], args=["--model-repository", str(repo["root"])])
    mod = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)

    def index():
        if protocol == "http":
            return {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        return {m.name: m.state for m in client.get_model_repository_index().models}

    assert index() == {"fscore": "READY", "other": "UNAVAILABLE"}
    client.load_model("other")
    assert index() == {"fscore": "READY", "other": "READY"}
    assert server.stop() == 0


def test_index_ready_only_leaves_out_unloaded_artifacts(launch, repo):
    write_fake_artifact(repo["root"] / "other", EngineSpec("other", SCORE_SPEC.program))
    (repo["root"] / "other" / "manifest.json").write_text("{}")
    server = launch([repo["link"]], args=["--model-repository", str(repo["root"])])
    status, every = post_json(server, "/v2/repository/index", {})
    assert status == 200 and [m["name"] for m in every] == ["fscore", "other"]
    status, ready = post_json(server, "/v2/repository/index", {"ready": True})
    assert status == 200 and [m["name"] for m in ready] == ["fscore"]
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_what_the_policy_refuses(launch, repo, protocol):
    write_fake_artifact(repo["root"] / "misnamed", SCORE_SPEC)  # an artifact named fscore in DIR/misnamed
    write_fake_artifact(repo["root"] / "broken", SCORE_SPEC, load_error="manifest.json is corrupted")
    server = launch([repo["link"]], args=["--model-repository", str(repo["root"])])
    mod = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    bad = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    for name, message in [("nope", "has no directory 'nope'"), (".hidden", "cannot name a directory"),
                          ("misnamed", "is named 'fscore'"), ("broken", "manifest.json is corrupted")]:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert err.value.status() == bad and message in err.value.message(), err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.load_model("fscore", config='{"max_batch_size": 8}')
    assert err.value.status() == bad and "load parameters (config) are not supported" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.unload_model("fscore")
    assert err.value.status() == ("400" if protocol == "http" else "StatusCode.UNAVAILABLE")
    assert "unload (of fscore) is not supported" in err.value.message()
    if protocol == "grpc":  # a path in the name never reaches the disk (HTTP routes cannot carry a '/')
        with pytest.raises(InferenceServerException) as err:
            client.load_model("../versions")
        assert err.value.status() == bad and "cannot name a directory" in err.value.message()
    assert client.is_model_ready("fscore") and infer_width(client, mod, ["still v1"]) == 2
    assert len(read_events(repo["log"], "loaded")) == 1  # nothing but the first load
    assert server.stop() == 0


def test_replace_real_engines(launch, make_checkpoint, tmp_path):
    """Eager engines over two checkpoints (the session's tiny Qwen3 and Qwen2) under one name: after
    the load, the server answers the second one's scores, the first engine closed on the way."""
    from boundgen.text.tokenizer import Tokenizer

    labels = [" yes", " no"]
    versions = {}
    for version, preset in enumerate(["tiny-qwen3", "tiny-qwen2"]):
        model_dir = make_checkpoint(preset)
        spec = {"task": "score", "labels": labels, "label_token_ids": list(Tokenizer.from_dir(model_dir)
                                                                          .label_token_ids(labels)),
                "max_samples": 4, "max_tokens_per_sample": 32, "max_total_tokens": 128}
        versions[version] = write_eager_artifact(tmp_path / "versions" / preset, model_dir, spec, "escore")
    root = tmp_path / "repo"
    root.mkdir()
    os.symlink(versions[0], root / "escore")
    texts = ["query: running shoes | item: trail shoe", "hello"]

    expected = [eager_engine_from_config(json.loads((versions[v] / "eager.json").read_text())).score(texts).scores
                for v in (0, 1)]

    server = launch([root / "escore"], args=["--model-repository", str(root)])
    client = thttp.InferenceServerClient(server.http_url)

    def served():
        t = thttp.InferInput("TEXT", [len(texts)], "BYTES")
        t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
        return client.infer("escore", [t]).as_numpy("SCORES")

    np.testing.assert_allclose(served(), expected[0], rtol=1e-5, atol=1e-7)
    switch(root / "escore", versions[1])
    client.load_model("escore")
    np.testing.assert_allclose(served(), expected[1], rtol=1e-5, atol=1e-7)
    assert not np.allclose(expected[0], expected[1])
    assert server.stop() == 0
    assert "the replaced escore drained and closed" in server.tail(50)


@pytest.mark.parametrize("flags, message", [
    (["--model-repository", "MISSING"], "is not a directory"),
    (["--model-repository", "ROOT", "--replicas", "2"], "cannot be combined with --replicas"),
    (["--model-repository", "ROOT", "--ray"], "cannot be combined with --replicas / --gpus / --ray"),
])
def test_bad_model_repository_flags_exit_2(repo, flags, message):
    flags = [str(repo["tmp"] / "missing") if f == "MISSING" else str(repo["root"]) if f == "ROOT" else f for f in flags]
    proc = subprocess.run([sys.executable, "-m", "tests.server.fake_serve", str(repo["link"]), "--http-port", "0",
                           "--grpc-port", "0", *flags], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
