"""`POST /v1/beam`: a JSON convenience route for beam artifacts, beside `/v1/score` (score_api.py)
for clients that would rather not build KServe tensors. Each prompt here is one engine call, as
a KServe v2 `infer` of TEXT [1] would be (the same checks, admission and engine), without tensors.

    request   {"prompt": "..."}  or  {"prompts": ["...", ...]},  "model": "name" (optional),
              "allow_items": [item_id, ...] (optional; a constrained model's allow-list, ALLOW_ITEMS),
              "allow_subset": "name" (optional; a subset registered with its catalogue, ALLOW_SUBSET)
    response  {"model": "name", "object": "beam", "candidates": [...]}           (prompt)
              {"model": "name", "object": "beam", "results": [{"candidates": [...]}, ...]}  (prompts)
    candidate {"token_ids": [...], "text": "...", "score": s}, W of them, best first; a constrained
              model's also "item_id" (-1, with score null and no tokens, where fewer than W items
              could be reached)

A candidate is what `boundgen beam` prints (BeamResult.candidates): the generated ids without
the -1 padding after a stop token, the decoded text, the FP32 score (sum of log-probs); the
numbers are the KServe outputs TOKEN_IDS, TEXT_OUT and SCORES of the same prompt. The prompts
of one request are admitted as separate requests, side by side, under one deadline (the
server's default); the first prompt to fail fails the whole request with its
status (a bad prompt 400, naming its index; a full queue 429; ...) and the others are cancelled.
`model` may be left out when the server holds one beam model.

Unknown fields are refused (400 naming them), as `/v1/score` refuses them: the width, the steps
and the deadline are the artifact's and the server's, so a `width` sent here would change nothing.
Bounds come before work: more prompts than the model can hold at once (its max in flight plus
its queue: more would be refused 429 anyway, after the first ones had run) are refused by their
count, 400 naming the limit, before any prompt is encoded or admitted; a prompt that is not valid
Unicode (a lone surrogate from a JSON escape) is 400 naming it. Every prompt's task has its
outcome retrieved, so that a request failed early (or cancelled) leaves no "Task exception was
never retrieved" behind.
"""

from __future__ import annotations

import asyncio

import numpy as np

from boundgen.errors import InvalidInput
from boundgen.runtime.results import BeamResult
from boundgen.server.models import LOADING, ModelSet
from boundgen.server.status import Unavailable
from boundgen.text.utf8 import utf8

ROUTE = "/v1/beam"
FIELDS = ("prompt", "prompts", "model", "allow_items", "allow_subset")  # width, steps, a deadline: the artifact's


def parse(obj) -> dict:
    """The request's fields, checked (InvalidInput naming what is wrong)."""
    if not isinstance(obj, dict):
        raise InvalidInput('a /v1/beam request is a JSON object like {"prompt": "..."} or {"prompts": ["...", ...]}')
    unknown = sorted(k for k in obj if k not in FIELDS)
    if unknown:  # a client that sends width or steps must not believe they took effect
        raise InvalidInput(f"a /v1/beam request has unknown fields {', '.join(map(repr, unknown))}; it takes "
                           f"{', '.join(FIELDS)} (the width and steps are the artifact's, fixed at build)")
    if ("prompt" in obj) == ("prompts" in obj):
        raise InvalidInput("give either prompt (one text) or prompts (a list of texts), not both or neither")
    if "prompt" in obj:
        prompts, single = [obj["prompt"]], True
        if not isinstance(obj["prompt"], str):
            raise InvalidInput("prompt must be a text (pre-tokenized prompts are not supported: send the text)")
    else:
        prompts, single = obj["prompts"], False
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise InvalidInput("prompts must be a non-empty list of texts (pre-tokenized prompts are not "
                               "supported: send the texts)")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("model must be a model name")
    allow = obj.get("allow_items")
    if allow is not None and (not isinstance(allow, list) or not allow
                              or not all(isinstance(i, int) and not isinstance(i, bool) for i in allow)):
        raise InvalidInput("allow_items must be a non-empty list of integer item ids")
    if allow is not None and not all(-2**63 <= i < 2**63 for i in allow):
        raise InvalidInput("allow_items holds an id outside the int64 range")
    subset = obj.get("allow_subset")
    if subset is not None and (not isinstance(subset, str) or not subset):
        raise InvalidInput("allow_subset must name a subset of the catalogue (a non-empty text)")
    return {"prompts": prompts, "single": single, "model": model, "allow_items": allow, "allow_subset": subset}


def pick_model(models: ModelSet, requested: str | None) -> str:
    """The model to run: the one named, else the server's only beam model."""
    if models.state == LOADING:
        raise Unavailable("the server is still loading its models")
    return models.pick(requested, "beam", ROUTE)


def candidates(result: BeamResult) -> list[dict]:
    """A beam result -> `boundgen beam`'s candidates, as the KServe outputs TOKEN_IDS [W, N_gen],
    SCORES [W] (FP32), TEXT_OUT [W] carry them."""
    scores = np.asarray(result.scores, dtype=np.float32)
    out = [{"token_ids": [int(t) for t in row if t >= 0], "text": text,
            "score": float(score) if np.isfinite(score) else None}  # -inf: a missing candidate
           for row, text, score in zip(np.asarray(result.token_ids), result.texts, scores)]
    if result.item_ids is not None:  # ITEM_IDS of a constrained model
        for cand, item in zip(out, result.item_ids.tolist()):
            cand["item_id"] = int(item)
    return out


def check_count(models: ModelSet, name: str, prompts: list[str]) -> None:
    """Refuse more prompts than model `name` can admit at once (module docstring)."""
    admission = models.get(name).admission
    limit = admission.max_inflight + admission.max_queue
    if len(prompts) > limit:
        raise InvalidInput(f"prompts has {len(prompts)} texts, over the limit of {limit} per request for model "
                           f"{name} (its {admission.max_inflight} in flight plus {admission.max_queue} queued)")


async def run(models: ModelSet, name: str, prompts: list[str], deadline: float,
              allow_items: list[int] | None = None, allow_subset: str | None = None) -> list[list[dict]]:
    """Each prompt as one engine call, side by side; the candidates per prompt, in order.
    allow_items, allow_subset: ALLOW_ITEMS and ALLOW_SUBSET of every prompt (a constrained model's)."""
    check_count(models, name, prompts)
    encoded = [utf8(p, f"prompts[{i}]" if len(prompts) > 1 else "prompt") for i, p in enumerate(prompts)]
    signature = models.get(name).signature

    async def one(i: int, prompt: bytes) -> list[dict]:
        try:
            call = signature.call([prompt])
            if allow_items is not None or allow_subset is not None:
                call = signature.allowing(call, allow_items, allow_subset)
            return candidates(await models.run(name, call, deadline))
        except InvalidInput as exc:
            raise InvalidInput(f"prompts[{i}]: {exc}" if len(prompts) > 1 else str(exc)) from None

    tasks = [asyncio.ensure_future(one(i, p)) for i, p in enumerate(encoded)]
    for task in tasks:  # whatever happens below, each task's outcome is retrieved when it ends
        task.add_done_callback(_retrieve)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:  # the first failure in prompt order, once it is known
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()


def _retrieve(task: asyncio.Future) -> None:
    """Mark a finished task's exception as retrieved (asyncio logs those never looked at)."""
    if not task.cancelled():
        task.exception()


def response(model: str, results: list[list[dict]], single: bool) -> dict:
    if single:
        return {"model": model, "object": "beam", "candidates": results[0]}
    return {"model": model, "object": "beam", "results": [{"candidates": c} for c in results]}
