"""Ray Serve's HTTP proxy answering its own errors as boundgen does: `{"error": "..."}`.

Errors from a replica are boundgen's already (server/kserve/http_api.py). Those Ray's proxy makes itself
are plain text: 429 when every replica and the router queue are full (ray_serve.py), 503 while
no replica is up, 404 before the application is deployed, 408 on Ray's request timeout.
`JsonErrors` rewrites such an answer's body to the JSON error body of the public contract,
keeping its status and headers (Retry-After included). A request whose replica died under it
gets no answer from Ray's proxy (the HTTP server would send a bare 500): it is answered 503
`{"error": ...}`, as plain serve's --replicas front end answers a request whose worker died.

Ray's proxy takes middlewares only from the function named by the environment variable
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH (ray_serve.PROXY_CALLBACK_ENV), which must be set
where the proxy starts: ray_serve.py sets it for a local Ray instance; on a cluster, set it on
every `ray start` (docs/serving.md). The proxy imports this module, so it imports nothing of
boundgen beyond it (no torch).
"""

from __future__ import annotations

import json
import logging

from starlette.middleware import Middleware


log = logging.getLogger("boundgen.server")


def middlewares() -> list[Middleware]:
    """Called by Ray's HTTP proxy once, at start (ray_serve.PROXY_CALLBACK names this function)."""
    return [Middleware(JsonErrors)]


class JsonErrors:
    """ASGI middleware: an error answer (status >= 400) whose body is not JSON gets `{"error": body}`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: dict | None = None  # the response start of an answer being rewritten
        chunks: list[bytes] = []
        started = False  # a response start has gone to the client

        async def rewrite(message):
            nonlocal held, started
            if message["type"] == "http.response.start" and message["status"] >= 400 and not _is_json(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                started = started or message["type"] == "http.response.start"
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            text = b"".join(chunks).decode("utf-8", "replace").strip() or f"HTTP {held['status']}"
            body = json.dumps({"error": text}).encode()
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            started = True
            await send({**held, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        async def refuse(reason: str) -> None:
            log.warning("Ray's proxy gave no answer to %s %s: %s", scope.get("method"), scope.get("path"), reason)
            await rewrite({"type": "http.response.start", "status": 503, "headers": []})
            await rewrite({"type": "http.response.body", "body": b"the replica serving this request failed "
                           b"before it answered; retry, another replica serves it"})

        try:
            await self.app(scope, receive, rewrite)
        except BaseException as exc:
            if not started:
                await refuse(f"{type(exc).__name__}: {exc}")
            raise  # the HTTP server sees the answer started: it only logs the error
        if not started:  # the replica died under the request: the proxy returns without an answer
            await refuse("no response")


def _is_json(start: dict) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in start.get("headers", []))
