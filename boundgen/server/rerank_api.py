"""The reranking routes that existing clients call, on a score artifact: Cohere / Jina / vLLM's
`POST /v1/rerank` (also `/rerank`), vLLM's `POST /score`, and OpenAI's `GET /v1/models`, so a
client written for those servers works unchanged. Each request here is one engine call of its
N samples, as a KServe v2 `infer` of TEXT [N] would be (the same checks, admission and engine).

    POST /v1/rerank, /rerank
      request   {"query": "...", "documents": ["..." | {"text": "..."}, ...], "top_n": k,
                 "return_documents": true, "model": "name"}
      response  {"id": "rerank-...", "model": "name", "usage": {...},
                 "results": [{"index": i, "relevance_score": p, "document": {"text": "..."}}, ...]}
                best first; top_n of them (default all); "document" unless return_documents is false
    POST /score
      request   {"text_1": "..." | ["...", ...], "text_2": "..." | ["...", ...], "model": "name"}
      response  {"id": "score-...", "object": "list", "model": "name", "usage": {...},
                 "data": [{"index": i, "object": "score", "score": p}, ...]}     in pair order
    GET /v1/models
      response  {"object": "list", "data": [{"id": "name", "object": "model", "created": t,
                 "owned_by": "boundgen"}, ...]}

Each (query, document) pair is one sample, the text query + document as `/v1/score` builds it
(score_api.parse), which the engine renders through the artifact's template. Its relevance is
the probability of the model's first label (of `--labels "yes" "no"`: P(yes) renormalised over
the labels; of an MLP head: class 0). `/score` pairs text_1 with text_2 as vLLM does: one
text_1 with every text_2, or the i-th with the i-th. The token counts of `usage` are not known
to the server (the engine tokenizes), so they are null, as in `/v1/score`. Unknown fields, more
pairs than the model's max_samples (checked before anything is tokenized), an empty list or a
beam model are 400 with a message saying so. `model` may be left out when the server holds one
score model. The API key applies as on every route (kserve/http_api.py's middleware).
"""

from __future__ import annotations

import time
import uuid

import numpy as np
from aiohttp import web

from boundgen.errors import InvalidInput, shown
from boundgen.server import json_values, score_api
from boundgen.server.config import ServerConfig
from boundgen.server.connections import arrived
from boundgen.server.http_bodies import error_response, read_json
from boundgen.server.models import LOADING, ModelSet
from boundgen.server.status import Unavailable, check_deadline
from boundgen.text.utf8 import utf8

RERANK_ROUTES = ("/v1/rerank", "/rerank")
PAIRS_ROUTE = "/score"
MODELS_ROUTE = "/v1/models"
RERANK_FIELDS = ("model", "query", "documents", "top_n", "return_documents")
PAIRS_FIELDS = ("model", "text_1", "text_2")
DOCUMENT_FIELDS = ("text",)
USAGE = {"prompt_tokens": None, "total_tokens": None}


def check_fields(obj, allowed: tuple[str, ...], what: str) -> None:
    """InvalidInput naming the fields of `obj` (a JSON object, else InvalidInput) that `allowed` lacks."""
    if not isinstance(obj, dict):
        raise InvalidInput(f"{what} must be a JSON object with {', '.join(allowed)}")
    unknown = sorted(k for k in obj if k not in allowed)
    if unknown:
        raise InvalidInput(f"{what} has unknown fields {', '.join(map(repr, unknown))}; it takes "
                           f"{', '.join(allowed)}")


def _model_name(obj: dict) -> str | None:
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("model must be a model name")
    return model


def _texts(value, name: str) -> list[str]:
    """A text or a non-empty list of texts, as a list."""
    one = isinstance(value, str)
    value = [value] if one else value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{name} must be a text or a non-empty list of texts (pre-tokenized input is not "
                           "supported: send the texts)")
    for i, text in enumerate(value):  # named here: once joined to its pair, a text's fault was its pair's
        utf8(text, name if one else f"{name}[{i}]")
    return value


def parse_rerank(obj) -> dict:
    """A rerank request's fields, checked (InvalidInput naming what is wrong)."""
    check_fields(obj, RERANK_FIELDS, "a rerank request")
    query = obj.get("query")
    if not isinstance(query, str):
        raise InvalidInput("query must be a text")
    utf8(query, "query")  # here: joined to each document, its fault was the document's
    documents = obj.get("documents")
    if not isinstance(documents, list) or not documents:
        raise InvalidInput('documents must be a non-empty list of texts or {"text": "..."} objects')
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, dict):
            check_fields(doc, DOCUMENT_FIELDS, f"documents[{i}]")
            doc = doc.get("text")
        if not isinstance(doc, str):
            raise InvalidInput(f'documents[{i}] must be a text or {{"text": "..."}}')
        texts.append(doc)
    top_n = obj.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InvalidInput(f"top_n must be a positive integer, got {shown(top_n)}")
    return_documents = obj.get("return_documents", True)
    if not isinstance(return_documents, bool):
        raise InvalidInput("return_documents must be true or false")
    return {"model": _model_name(obj), "query": query, "documents": texts, "top_n": top_n,
            "return_documents": return_documents}


def parse_pairs(obj) -> dict:
    """vLLM's score request: text_1 and text_2 paired 1:1, 1:N or N:N (InvalidInput otherwise)."""
    check_fields(obj, PAIRS_FIELDS, "a score request")
    first, second = _texts(obj.get("text_1"), "text_1"), _texts(obj.get("text_2"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidInput(f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1 for "
                           "every text_2, or one text_1 for all of them")
    return {"model": _model_name(obj), "pairs": list(zip(first, second))}


def samples(query: str, documents: list[str]) -> list[str]:
    """The sample texts of query with each document, built as `/v1/score` builds its items'."""
    parsed = score_api.parse({"query": query, "items": documents, "label_token_ids": [0], "apply_softmax": True})
    return [parsed["query"] + item for item in parsed["items"]]


def pick_model(models: ModelSet, requested: str | None, route: str, pairs: int) -> str:
    """The score model to run, checked to take `pairs` samples in one request (before tokenizing)."""
    if models.state == LOADING:
        raise Unavailable("the server is still loading its models")
    name = models.pick(requested, "score", route)
    limit = models.get(name).engine.spec.program.max_samples
    if pairs > limit:
        raise InvalidInput(f"{pairs} documents to score, more than model {name} takes in one request: at most "
                           f"{limit} (its max_samples); send them in several requests")
    return name


async def relevance(models: ModelSet, name: str, texts: list[str], deadline: float) -> list[float]:
    """Each text's probability of the model's first label, from one engine call of them all."""
    call = models.get(name).signature.call([utf8(t, f"documents[{i}]") for i, t in enumerate(texts)])
    result = await models.run(name, call, deadline)
    return [float(p) for p in np.asarray(result.scores, dtype=np.float32)[:, 0]]


def rerank_response(name: str, parsed: dict, scores: list[float]) -> dict:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:parsed["top_n"]]
    results = []
    for i in order:
        result = {"index": i, "relevance_score": scores[i]}
        if parsed["return_documents"]:
            result["document"] = {"text": parsed["documents"][i]}
        results.append(result)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": name, "results": results, "usage": dict(USAGE)}


def pairs_response(name: str, scores: list[float]) -> dict:
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "model": name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": dict(USAGE)}


def models_response(models: ModelSet, created: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "boundgen"}
                                       for name in sorted(models.models)]}


def add_routes(app: web.Application, models: ModelSet, config: ServerConfig) -> None:
    """Register this module's routes on the HTTP application (kserve/http_api.py; its middlewares,
    the API key among them, apply to them as to every route)."""
    created = int(time.time())  # OpenAI's "created": when this server began serving its models

    async def rerank(request: web.Request) -> web.Response:
        try:
            with models.observe("http") as seen:  # counted whatever its end, a bad body too
                parsed = parse_rerank(await read_json(request, config, json_values.budget(models, task="score")))
                name = seen.name = pick_model(models, parsed["model"], request.path, len(parsed["documents"]))
                deadline = models.deadline(arrived(request), None)
                scores = await relevance(models, name, samples(parsed["query"], parsed["documents"]), deadline)
                response = web.json_response(rerank_response(name, parsed, scores))
                check_deadline(deadline, name)  # no success after its deadline, as every inference route
                return response
        except Exception as exc:
            return error_response(exc)

    async def score_pairs(request: web.Request) -> web.Response:
        try:
            with models.observe("http") as seen:
                parsed = parse_pairs(await read_json(request, config, json_values.budget(models, task="score")))
                name = seen.name = pick_model(models, parsed["model"], PAIRS_ROUTE, len(parsed["pairs"]))
                texts = [samples(first, [second])[0] for first, second in parsed["pairs"]]
                deadline = models.deadline(arrived(request), None)
                scores = await relevance(models, name, texts, deadline)
                response = web.json_response(pairs_response(name, scores))
                check_deadline(deadline, name)
                return response
        except Exception as exc:
            return error_response(exc)

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(models_response(models, created))

    for route in RERANK_ROUTES:
        app.router.add_post(route, rerank)
    app.router.add_post(PAIRS_ROUTE, score_pairs)
    app.router.add_get(MODELS_ROUTE, list_models)
