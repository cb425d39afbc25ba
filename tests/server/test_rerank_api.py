"""The reranking clients' routes (server/rerank_api.py) on a real server process with fake engines:
`/v1/rerank` and `/rerank` (Cohere / Jina / vLLM), vLLM's `/score` and OpenAI's `/v1/models`,
called with `requests` as those clients call them. Relevance is the KServe v2 infer's first label
of the text query + document; bad requests are a JSON 400 naming the problem; the API key applies."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.server.conftest import SCORE_SPEC
from tests.server.test_score_api import kserve_scores

QUERY = "query: shoes | item: "
DOCS = ["trail runner", "desk lamp", "running shoe", "lamp shade"]


def call(server, method: str, route: str, body=None, headers=None) -> requests.Response:
    session = requests.Session()
    session.trust_env = False  # loopback: no proxy from the environment
    return session.request(method, f"http://{server.http_url}{route}", json=body, headers=headers, timeout=30)


def relevance(server, texts) -> list[float]:
    return [float(p) for p in kserve_scores(server, texts)[:, 0]]


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
def test_rerank_orders_documents_by_the_first_labels_probability(fake_server, route):
    answer = call(fake_server, "POST", route, {"query": QUERY, "documents": DOCS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    want = relevance(fake_server, [QUERY + d for d in DOCS])
    assert body["model"] == "fscore" and body["id"].startswith("rerank-") and "usage" in body
    assert [r["index"] for r in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for r in body["results"]:
        np.testing.assert_allclose(r["relevance_score"], want[r["index"]], rtol=1e-6)
        assert r["document"] == {"text": DOCS[r["index"]]}


def test_rerank_top_n_objects_and_no_documents(fake_server):
    docs = [{"text": d} for d in DOCS[:3]]
    full = call(fake_server, "POST", "/v1/rerank", {"query": QUERY, "documents": docs, "model": "fscore"}).json()
    top = call(fake_server, "POST", "/v1/rerank", {"query": QUERY, "documents": docs, "top_n": 2,
                                                   "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full["results"]][:2]
    assert all("document" not in r for r in top["results"])
    for past_the_end in (9, 2 ** 70):  # all of them, as Cohere's and Jina's rerank APIs give
        assert len(call(fake_server, "POST", "/v1/rerank", {"query": QUERY, "documents": docs,
                                                            "top_n": past_the_end}).json()["results"]) == 3


def test_vllm_score_pairs_one_to_many_and_many_to_many(fake_server):
    answer = call(fake_server, "POST", "/score", {"model": "fscore", "text_1": QUERY, "text_2": DOCS[:2]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "fscore" and body["id"].startswith("score-")
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "score"), (1, "score")]
    np.testing.assert_allclose([d["score"] for d in body["data"]],
                               relevance(fake_server, [QUERY + d for d in DOCS[:2]]), rtol=1e-6)
    pairs = call(fake_server, "POST", "/score", {"text_1": ["a ", "b "], "text_2": ["x", "y"]}).json()
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], relevance(fake_server, ["a x", "b y"]), rtol=1e-6)


def test_models_lists_every_model_in_openai_shape(fake_server):
    body = call(fake_server, "GET", "/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fbeam", "fscore"]
    assert all(m["object"] == "model" and m["owned_by"] == "boundgen" and isinstance(m["created"], int)
               for m in body["data"])


LIMIT = SCORE_SPEC.program.max_samples


@pytest.mark.parametrize("route,body,message", [
    ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["x"], "max_chunks": 2},
     "unknown fields 'max_chunks', 'rank_fields'"),
    ("/v1/rerank", {"query": "q", "documents": [{"text": "a", "title": "t"}]}, "documents[0] has unknown fields 'title'"),
    ("/v1/rerank", {"query": "q", "documents": ["w"] * (LIMIT + 1)}, f"at most {LIMIT} (its max_samples)"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents must be a non-empty list"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n must be a positive integer"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "fbeam"}, "is a beam model"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, "text_1 has 2 texts and text_2 3"),
    ("/score", {"text_1": "q", "text_2": [[1, 2]]}, "pre-tokenized input is not supported"),
    ("/score", {"text_1": "q", "text_2": "x", "encoding_format": "float"}, "unknown fields 'encoding_format'"),
    # a text's fault named where it is (once joined to its pair, it was said to be documents[i]'s)
    ("/v1/rerank", {"query": "\ud800", "documents": ["a"]}, "query is not valid UTF-8"),
    ("/score", {"text_1": "\ud800", "text_2": ["a", "b"]}, "text_1 is not valid UTF-8"),
    ("/score", {"text_1": ["a", "b \udfff"], "text_2": ["a", "b"]}, "text_1[1] is not valid UTF-8"),
])
def test_bad_requests_are_a_json_400_naming_the_problem(fake_server, route, body, message):
    answer = call(fake_server, "POST", route, body)
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text


@pytest.mark.parametrize("route,body", [
    ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "m" * 50_000}),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "x" * 50_000}),
    ("/score", {"text_1": "q", "text_2": "x", "model": "m" * 50_000}),
    ("/v1/beam", {"prompt": "a", "model": "m" * 50_000}),
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [9693], "model": "m" * 50_000}),
])
def test_an_error_cuts_the_clients_value_short(fake_server, route, body):
    """A long model name or top_n was echoed whole (200,000 characters: a 200-400 KB answer)."""
    answer = call(fake_server, "POST", route, body)
    assert answer.status_code == 400 and len(answer.content) < 2000, answer.text[:300]
    assert "(50002 characters)" in answer.text, answer.text


def test_too_many_documents_are_refused_before_the_engine_sees_them(fake_server, fake_dirs):
    marker = "never-tokenized-marker"
    call(fake_server, "POST", "/v1/rerank", {"query": "q", "documents": [marker] * (LIMIT + 1)})
    assert marker not in fake_dirs["log"].read_text()


@pytest.fixture(scope="module")
def keyed_server(launch, fake_dirs):
    server = launch([fake_dirs["score"]], args=["--api-key", "sekrit"])
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("method,route,body", [("POST", "/v1/rerank", {"query": "q", "documents": ["a"]}),
                                               ("POST", "/score", {"text_1": "q", "text_2": "a"}),
                                               ("GET", "/v1/models", None)])
def test_the_api_key_applies(keyed_server, method, route, body):
    refused = call(keyed_server, method, route, body)
    assert refused.status_code == 401 and "API key" in refused.json()["error"]
    assert call(keyed_server, method, route, body, headers={"Authorization": "Bearer sekrit"}).status_code == 200


def test_a_server_without_a_score_model_says_so(launch, fake_dirs):
    """Before: "name the model: this server holds score models none", though no name could do."""
    server = launch([fake_dirs["beam"]])
    for route, body in [("/v1/rerank", {"query": "q", "documents": ["a"]}), ("/score", {"text_1": "q", "text_2": "a"}),
                        ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [9693]})]:
        answer = call(server, "POST", route, body)
        assert answer.status_code == 400, answer.text
        assert f"{route} needs a score model, and this server holds none (its models: fbeam)" in answer.json()["error"]
    assert server.stop() == 0
