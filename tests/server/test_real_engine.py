"""The server over a real engine (eager, tiny random-weight Qwen3 with the real vocabulary):
outputs over HTTP and gRPC equal the in-process engine's; token limits come back as 400."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.server.real import eager_engine_from_config, write_eager_artifact

TEXTS = ["query: running shoes | item: trail shoe", "query: 咖啡 | item: 拿铁", "hello"]
PROMPT = "query: running shoes -> item id:"


@pytest.fixture(scope="module")
def eager_models(tiny_qwen3_dir, tmp_path_factory):

    from boundgen.text.tokenizer import Tokenizer

    labels = [" yes", " no"]
    ids = list(Tokenizer.from_dir(tiny_qwen3_dir).label_token_ids(labels))
    root = tmp_path_factory.mktemp("eager")
    score = {"task": "score", "labels": labels, "label_token_ids": ids, "max_samples": 4,
             "max_tokens_per_sample": 32, "max_total_tokens": 128}
    beam = {"task": "beam", "width": 4, "steps": 3, "max_prompt_tokens": 32}
    return {"score": write_eager_artifact(root / "escore", tiny_qwen3_dir, score, "escore"),
            "beam": write_eager_artifact(root / "ebeam", tiny_qwen3_dir, beam, "ebeam")}


@pytest.fixture(scope="module")
def eager_server(launch, eager_models):
    server = launch([eager_models["score"], eager_models["beam"]])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def engines(eager_models):
    import json

    return {task: eager_engine_from_config(json.loads((d / "eager.json").read_text()))
            for task, d in eager_models.items()}


def infer(protocol, server, model, texts):
    mod = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    t = mod.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    return client.infer(model, [t])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_equal_in_process_engine(eager_server, engines, protocol):
    expected = engines["score"].score(TEXTS)
    got = infer(protocol, eager_server, "escore", TEXTS).as_numpy("SCORES")
    np.testing.assert_allclose(got, expected.scores, rtol=1e-5, atol=1e-7)

    expected = engines["beam"].beam(PROMPT)
    result = infer(protocol, eager_server, "ebeam", [PROMPT])
    np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)
    assert [t.decode() for t in result.as_numpy("TEXT_OUT")] == expected.texts


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_token_limit_is_400_naming_sample_and_limit(eager_server, protocol):
    with pytest.raises(InferenceServerException) as err:
        infer(protocol, eager_server, "escore", ["short", "word " * 40])
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "sample 1" in err.value.message() and "32" in err.value.message()
