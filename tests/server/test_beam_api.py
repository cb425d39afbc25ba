"""`POST /v1/beam` (server/beam_api.py) on a real server process: the candidates of the KServe v2
infer of the same prompt (token ids, text, score), one prompt or several, and a JSON 400 naming
the problem for what a beam model cannot answer."""

from __future__ import annotations


import numpy as np
import pytest
import tritonclient.http as thttp

from tests.server.conftest import post_json


def post(server, body) -> tuple[int, dict]:
    return post_json(server, "/v1/beam", body)


def kserve_candidates(server, prompt) -> list[dict]:
    t = thttp.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    result = thttp.InferenceServerClient(server.http_url).infer("fbeam", [t])
    ids, scores = result.as_numpy("TOKEN_IDS"), result.as_numpy("SCORES")
    texts = [t.decode() for t in result.as_numpy("TEXT_OUT")]
    return [{"token_ids": [int(i) for i in row if i >= 0], "text": text, "score": float(score)}
            for row, text, score in zip(ids, texts, scores)]


def test_same_candidates_as_kserve(fake_server):
    status, answer = post(fake_server, {"prompt": "query: shoes ->"})
    assert status == 200 and answer["model"] == "fbeam" and answer["object"] == "beam"
    assert answer["candidates"] == kserve_candidates(fake_server, "query: shoes ->")
    assert len(answer["candidates"]) == 3  # the artifact's width
    prompts = ["query: shoes ->", "query: 咖啡 ->", "a b c"]
    status, answer = post(fake_server, {"prompts": prompts, "model": "fbeam"})
    assert status == 200
    assert [r["candidates"] for r in answer["results"]] == [kserve_candidates(fake_server, p) for p in prompts]


@pytest.mark.parametrize("body,message", [
    ({"prompt": "a", "prompts": ["b"]}, "either prompt"),
    ({}, "either prompt"),
    ({"prompts": []}, "non-empty list of texts"),
    ({"prompt": [1, 2, 3]}, "pre-tokenized prompts are not supported"),
    ({"prompt": "a", "model": "fscore"}, "is a score model"),
    ({"prompt": "a", "model": "nope"}, "unknown model 'nope'"),
    ({"prompts": ["fine", "w " * 9]}, "prompts[1]: "),  # over the fake model's 8 tokens
    ({"prompt": ""}, "empty"),
    (b"{not json", "not valid JSON"),
    ([1, 2], "is a JSON object"),
    ({"prompt": "a", "width": 1000, "steps": 99, "timeout": 1}, "unknown fields 'steps', 'timeout', 'width'"),
])
def test_what_a_beam_model_cannot_answer_is_a_json_400(fake_server, body, message):
    status, answer = post(fake_server, body)
    assert status == 400 and message in answer["error"], answer
    assert post(fake_server, {"prompt": "still serving"})[0] == 200
