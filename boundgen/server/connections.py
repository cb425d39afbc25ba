"""HTTP connections: limits that keep slow, idle or too many clients from holding the server.

    idle_timeout_s    a connection without a whole request head for this long is closed: a new
                      one that sends nothing, one idle between requests (keep-alive), one whose
                      request line or headers stall or trickle (aiohttp's keep-alive timer, which
                      runs from the connection's start or its last answer while it waits for a
                      complete head; bytes arriving do not reset it; and, for aiohttp versions whose
                      timer does not start with the connection, the protocol's own watch, which
                      closes it within two timeouts: LimitedRequestHandler._watch_heads)
    read_timeout_s    an inference body must arrive in full within this long of its head
                      (http_bodies.read_body reads it under this bound): a stalled or endless body is
                      answered 408 and the connection closed
    max_connections   HTTP connections open at once; one more is answered 503 and closed at once,
                      before anything of it is read

Errors found before a request reaches a route (a malformed request line or header, a line over
8190 bytes) are answered like every other error: JSON `{"error": ...}`, not aiohttp's text/plain.
gRPC connections get the idle timeout as `grpc.max_connection_idle_ms` (kserve/grpc_api.py).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import time
from typing import Callable

from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import LineTooLong

log = logging.getLogger("boundgen.server")


def _json_error(status: int, message: str) -> web.Response:
    """`{"error": message}` typed exactly `application/json`, as the application's errors (kserve/http_api.py)."""
    response = web.json_response({"error": message}, status=status)
    response.charset = None
    response.force_close()
    return response


ARRIVED = web.RequestKey("arrived", float)  # time.monotonic() when the request's head was parsed


def arrived(request: web.Request) -> float:
    """When `request` arrived (its head parsed: LimitedRequestHandler.head_time), where its
    deadline counts from; now, for a request that did not come through that protocol."""
    return request.get(ARRIVED) or time.monotonic()


class LimitedRequestHandler(web_protocol.RequestHandler):
    """aiohttp's per-connection protocol with the connection cap, JSON protocol errors, and each
    request's arrival: when its head was parsed (`head_time`)."""

    def __init__(self, manager: web_server.Server, *, max_connections: int, head_timeout_s: float | None = None,
                 unanswered: Callable[[str, str], None] | None = None, **kwargs):
        super().__init__(manager, **kwargs)
        self._max_connections = max_connections
        self._unanswered = unanswered  # told (method, path) of each request parsed but never handled
        self._heads: collections.deque = collections.deque()  # (message, time.monotonic() it was parsed)
        # The idle timeout's own watch (`_watch_heads`): aiohttp's keep-alive timer runs from the
        # connection's start in the aiohttp we test with, not in every version it may be served with
        # (on one GPU host's, on 2026-12-07, no trickled head was closed within 4.5 s of a 3 s timeout).
        self._head_timeout_s = kwargs.get("keepalive_timeout") if head_timeout_s is None else head_timeout_s
        self._head_watch: asyncio.TimerHandle | None = None
        self._heads_parsed = 0  # request heads parsed since the watch last looked
        self._any_head = False  # a request head was parsed on this connection

    def data_received(self, data: bytes) -> None:
        """aiohttp's, noting the time of each request head it parsed: a request's handler starts
        two turns of the event loop later, under load many milliseconds after its arrival. Once the
        server stops, aiohttp drops whatever arrives, the body of a request whose head came before
        the stop included: its handler then waited out --read-timeout-s for it (a 408, and the exit
        held as long). So while a request's body is still arriving, its bytes are let in."""
        messages = getattr(self, "_messages", None)  # aiohttp's queue of parsed requests
        before = len(messages) if messages is not None else 0
        closing = (self._close, self._force_close)
        let_in = any(closing) and self.transport is not None and self._body_arriving()
        if let_in:
            self._close = self._force_close = False
        try:
            super().data_received(data)
        finally:
            if let_in:  # closing again, and still so whatever aiohttp decided meanwhile
                self._close, self._force_close = self._close or closing[0], self._force_close or closing[1]
        if messages is not None and len(messages) > before:
            self._heads_parsed += len(messages) - before
            self._any_head = True
            now = time.monotonic()
            self._heads.extend((message, now) for message, _ in itertools.islice(messages, before, None))

    def _body_arriving(self) -> bool:
        """Whether a request whose head was parsed still waits for the rest of its body."""
        request = getattr(self, "_current_request", None)
        if request is not None and not request.content.is_eof():
            return True
        return any(not payload.is_eof() for _, payload in getattr(self, "_messages", None) or ())

    def head_time(self, message) -> float | None:
        """When the head of request `message` (its `request.message`) was parsed, or None when it
        was not noted; heads noted before it (requests that never reached the application) are dropped."""
        while self._heads:
            head, parsed = self._heads.popleft()
            if head is message:
                return parsed
        return None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._watch_heads()
        open_now = len(self._manager.connections) if self._manager is not None else 0
        if open_now > self._max_connections:
            body = json.dumps({"error": f"the server has {self._max_connections} HTTP connections open, its limit "
                                        "(--max-connections); retry later"}).encode()
            head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            transport.write(head + body)
            self.force_close()
            transport.close()

    def close(self) -> None:
        """aiohttp's (the server stopping: answer what has arrived, then close), and a connection with
        no request head yet is closed at once. aiohttp drops whatever arrives once it is closing, and
        only wakes a handler task that already waits for a request: one accepted just before the
        stop, whose task had not yet run, stayed open, its request unread and unanswered, until the
        idle timeout, and the server's stop waited that long for it."""
        super().close()
        if not self._any_head:
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_watch is not None:
            self._head_watch.cancel()
            self._head_watch = None
        # Requests whose heads were parsed and that were never handled (pipelined behind one whose
        # client left, or the connection closed by a stop): aiohttp drops them unseen.
        for message, _ in getattr(self, "_messages", None) or ():
            url = getattr(message, "url", None)  # none for a malformed head's error entry
            if self._unanswered is not None and url is not None:
                self._unanswered(message.method, url.path)
        super().connection_lost(exc)

    def _watch_heads(self) -> None:
        """Look again in one head timeout: a connection that parsed no request head in the whole
        period, and has none being handled or queued, is then closed (a head trickling in a byte at
        a time included), so one without a whole head is closed within one to two timeouts whatever
        aiohttp does (its own timer, where it has one, closes it after one)."""
        if self._head_timeout_s and self.transport is not None:
            self._heads_parsed = 0
            self._head_watch = asyncio.get_running_loop().call_later(self._head_timeout_s, self._look_at_heads)

    def _look_at_heads(self) -> None:
        self._head_watch = None
        busy = getattr(self, "_current_request", None) is not None or bool(getattr(self, "_messages", ()))
        if self._heads_parsed or busy:
            self._watch_heads()
        elif self.transport is not None:
            self.force_close()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # part of an answer went out: aiohttp's own handling
            return super().handle_error(request, status, exc, message)
        if status == 500:
            log.error("internal error handling an HTTP request", exc_info=exc)
            return _json_error(500, f"internal error: {type(exc).__name__ if exc else 'unknown'}")
        if isinstance(exc, LineTooLong):
            return _json_error(status, f"a request line or header is too long: {message or exc}")
        return _json_error(status, f"malformed HTTP request: {message or exc}")


async def listen(runner: web.AppRunner, host: str, port: int, max_connections: int,
                 handler_kwargs: dict, reuse_port: bool = False,
                 unanswered: Callable[[str, str], None] | None = None) -> asyncio.AbstractServer:
    """Listen on host:port with `runner`'s application, each connection a LimitedRequestHandler.
    Close the returned server before `runner.cleanup()` (which closes the connections).
    `reuse_port`: share the port with the other front-end processes (the kernel spreads
    connections over them; server/deploy/frontends.py). `unanswered(method, path)`: called for
    each request parsed and never handled, its connection closed first."""
    loop = asyncio.get_running_loop()
    manager = runner.server

    def factory() -> LimitedRequestHandler:
        return LimitedRequestHandler(manager, loop=loop, max_connections=max_connections, unanswered=unanswered,
                                     **handler_kwargs)

    return await loop.create_server(factory, host, port, reuse_address=True, reuse_port=reuse_port or None)
