"""KServe's own Python SDK (`kserve.InferenceRESTClient`, `kserve.InferenceGRPCClient`), unmodified,
against a server process: server live / ready (the REST client parses the Open Inference
Protocol's JSON bodies), model ready, and infer of a score and a beam model, over REST and gRPC,
with the numbers tritonclient gets. The SDK runs in a process of its own (kserve_sdk_client.py
says why)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from tests.server.conftest import REPO

# The [test] extra; requirements.txt pins it. Looked up, not imported: only the client process imports it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("kserve") is None, reason="kserve is not installed")
SCORE_TEXTS = ["query: shoes | item: trail runner", "b"]
PROMPT = "query: shoes ->"


def tritonclient_outputs(server, model, texts, names) -> list[np.ndarray]:
    t = tgrpc.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    result = tgrpc.InferenceServerClient(server.grpc_url).infer(model, [t])
    return [result.as_numpy(n) for n in names]


@pytest.fixture(scope="module")
def sdk_answers(fake_server) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.server.kserve_sdk_client", fake_server.http_url,
                           fake_server.grpc_url, json.dumps(SCORE_TEXTS), PROMPT], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_kserve_sdk_clients(fake_server, sdk_answers, protocol):
    got = sdk_answers[protocol]
    assert got["health"] == [True, True, True]
    (want,) = tritonclient_outputs(fake_server, "fscore", SCORE_TEXTS, ["SCORES"])
    np.testing.assert_array_equal(np.array(got["score"]["SCORES"], dtype=np.float32), want)
    ids, scores, texts = tritonclient_outputs(fake_server, "fbeam", [PROMPT], ["TOKEN_IDS", "SCORES", "TEXT_OUT"])
    np.testing.assert_array_equal(np.array(got["beam"]["TOKEN_IDS"]), ids)
    np.testing.assert_array_equal(np.array(got["beam"]["SCORES"], dtype=np.float32), scores)
    assert got["beam"]["TEXT_OUT"] == [t.decode() for t in texts]


def test_kserve_sdk_shows_the_servers_error_message(sdk_answers):
    """The REST client puts the body's "error" in its exception only for `Content-Type:
    application/json` exactly (no charset), which is how the server types its errors."""
    assert "unknown model 'nope'" in sdk_answers["rest"]["error"], sdk_answers["rest"]["error"]
