"""`boundgen serve` over real artifacts (tiny Qwen3, built once per session with `boundgen build`
on CPU): outputs over HTTP and gRPC equal `boundgen.load(dir)` in this process; metadata
carries the artifact's bounds; bounds are enforced with 400s."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import boundgen
from tests.server.conftest import REPO

pytestmark = pytest.mark.slow  # two AOTInductor compiles

TEXTS = ["query: running shoes | item: lightweight trail running shoe", "query: 咖啡 | item: 拿铁咖啡", "hi"]
PROMPT = "query: running shoes -> item id:"
BOUNDGEN_SERVE = [sys.executable, "-m", "boundgen", "serve"]


def build_all(model_dir, builds: dict) -> dict:
    """Run the `boundgen build`s side by side (each compile is mostly one thread) and wait for all."""
    procs = {}
    for task, (out, args) in builds.items():
        procs[task] = (out, subprocess.Popen([sys.executable, "-m", "boundgen", "build", str(model_dir), "--out",
                                              str(out), *args], cwd=REPO, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True))
    try:
        for task, (out, proc) in procs.items():
            output, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"building the {task} artifact failed:\n{output[-3000:]}"
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return {task: out for task, (out, _) in procs.items()}


@pytest.fixture(scope="session")
def artifacts(tiny_qwen3_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    return build_all(tiny_qwen3_dir, {
        "score": (root / "score", ["--task", "score", "--labels", " yes", " no", "--name", "ascore", "--max-samples",
                                   "4", "--max-tokens-per-sample", "32", "--max-total-tokens", "64"]),
        "beam": (root / "beam", ["--task", "beam", "--width", "4", "--steps", "3", "--name", "abeam",
                                 "--max-prompt-tokens", "32"]),
    })


@pytest.fixture(scope="module")
def artifact_server(launch, artifacts):
    server = launch([artifacts["score"], artifacts["beam"]], command=BOUNDGEN_SERVE)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def engines(artifacts):
    return {task: boundgen.load(path) for task, path in artifacts.items()}


def client_and_input(protocol, server, texts):
    mod = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    t = mod.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    return client, t


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_equal_in_process_engine(artifact_server, engines, protocol):
    client, t = client_and_input(protocol, artifact_server, TEXTS)
    np.testing.assert_allclose(client.infer("ascore", [t]).as_numpy("SCORES"), engines["score"].score(TEXTS).scores,
                               rtol=1e-5, atol=1e-7)
    client, t = client_and_input(protocol, artifact_server, [PROMPT])
    result, expected = client.infer("abeam", [t]), engines["beam"].beam(PROMPT)
    np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)
    assert [x.decode() for x in result.as_numpy("TEXT_OUT")] == expected.texts



def test_v1_beam_gives_the_engine_candidates(artifact_server, engines):
    """/v1/beam (server/beam_api.py) answers `boundgen beam`'s candidates of the compiled engine."""
    request = urllib.request.Request(f"http://{artifact_server.http_url}/v1/beam",
                                     data=json.dumps({"prompt": PROMPT}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60) as answer:
        got = json.loads(answer.read())["candidates"]
    want = engines["beam"].beam(PROMPT).candidates()
    assert [(c["token_ids"], c["text"]) for c in got] == [(c["token_ids"], c["text"]) for c in want]
    np.testing.assert_allclose([c["score"] for c in got], [c["score"] for c in want], rtol=1e-5, atol=1e-6)

def test_metadata_carries_artifact_bounds(artifact_server):
    meta = thttp.InferenceServerClient(artifact_server.http_url).get_model_metadata("ascore")
    assert meta["parameters"]["max_samples"] == 4 and meta["parameters"]["max_tokens_per_sample"] == 32
    beam = thttp.InferenceServerClient(artifact_server.http_url).get_model_metadata("abeam")
    assert [(o["name"], o["shape"]) for o in beam["outputs"]] == [("TOKEN_IDS", [4, 3]), ("SCORES", [4]),
                                                                  ("TEXT_OUT", [4])]


@pytest.mark.parametrize("texts,words", [
    (["ok", "word " * 40], ["sample 1", "32"]),
    (["word " * 30, "word " * 30, "word " * 30], ["tokens in all", "64"]),
    ([PROMPT] * 5, ["5 samples", "limit of 4"]),
])
def test_bounds_are_400(artifact_server, texts, words):
    client, t = client_and_input("grpc", artifact_server, texts)
    with pytest.raises(InferenceServerException) as err:
        client.infer("ascore", [t])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    for word in words:
        assert word in err.value.message(), err.value.message()
