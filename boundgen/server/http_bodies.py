"""HTTP request bodies and error answers, for every route (KServe v2's and the JSON routes):
a body read whole within the server's limits (--max-body-bytes, inflated for a compressed one;
--read-timeout-s), a JSON body, and the JSON error body `{"error": "..."}` with the status of
status.py. KServe v2's inference bodies (JSON and binary tensor data, shared memory
references): kserve/http_messages.py.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from boundgen.errors import Cancelled, InvalidInput
from boundgen.server import json_values
from boundgen.server.config import ServerConfig
from boundgen.server.inflation import Inflater, body_encoding, header_shown
from boundgen.server.json_worker import LARGE, JsonWorker, error_text, strict_loads
from boundgen.server.status import ReadTimeout, answer_status


UNREAD = web.ResponseKey("unread_body", bool)  # part of the request body was left unread (see `error_response`)
JSON_WORKER = web.AppKey("json_worker", JsonWorker)  # where an application's large bodies are parsed (`loads`)
STEP = 1 << 16  # the most bytes of a compressed body one step of the event loop inflates


class BodyRefused(InvalidInput):
    """A body refused before all of it was read: its connection is closed after the answer. With
    `drain`, the rest (known to be at most --max-body-bytes as sent) is read and dropped first,
    unparsed and uninflated, so that a client that sends all of its body before it reads gets the
    answer rather than a reset; else the connection is closed at once."""

    def __init__(self, message: str, drain: bool = False):
        super().__init__(message)
        self.drain = drain


class BodyTooLarge(BodyRefused):
    """The body (inflated, for a compressed one) passed --max-body-bytes: reading stopped there."""


async def read_body(request: web.Request, config: ServerConfig, budget: json_values.Budget = json_values.Budget(),
                    whom: str | None = None, header_length: str | None = None) -> bytes:
    """The whole body, within --max-body-bytes (else BodyTooLarge, a 400) and --read-timeout-s (else
    ReadTimeout). A compressed body (Content-Encoding gzip, deflate, br) counts inflated: it is
    inflated here (inflation.py) a step at a time as it is read, and reading stops at the limit. Its
    JSON (all of it, or the `header_length` bytes the binary extension's header gives) holds at most
    `budget.values` values and strings within `budget.longest` and `budget.total` bytes (json_values.py:
    counted as it arrives), else BodyRefused naming `whom` (a route, a model) as soon as the count passes the
    budget, the rest unread and unparsed (a UTF-16 or UTF-32 body: once all of it has arrived,
    counted in UTF-8). A client that closes before its body has arrived: Cancelled (499, counted
    `cancelled`)."""
    limit = config.max_body_bytes
    count = json_values.ValueCount(budget.values, _json_part(header_length), budget.longest, budget.total)
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the request body is {request.content_length} bytes, over the server's limit "
                           f"of {limit} (--max-body-bytes)")
    try:  # the whole body within --read-timeout-s: a stalled or endless one must not hold the connection
        body = await asyncio.wait_for(_read_within(request, limit, count, whom or request.path[:80]),
                                      config.read_timeout_s)
    except asyncio.TimeoutError:
        raise ReadTimeout(f"the request body did not arrive in full within {config.read_timeout_s:g} s "
                          "(--read-timeout-s)") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the request body is over the server's limit of {limit} bytes "
                           "(--max-body-bytes)") from None
    except ConnectionResetError:  # aiohttp's "Connection lost": the client closed before its body ended
        raise Cancelled("the client went away before its request body arrived in full") from None
    if count.over:
        count.recount(body)
        count.check("the request body", whom or request.path[:80])
    return body


def _json_part(header_length: str | None) -> int | None:
    """The JSON bytes of a body whose binary extension header says `header_length` (None: no
    header, all of it; 0 for a header that is not a length: the body is refused for it when parsed)."""
    if header_length is None:
        return None
    try:
        return max(0, int(header_length))  # as kserve/http_messages.parse_infer_body reads it
    except ValueError:
        return 0


def _check_transfer_coding(header: str | None) -> None:
    """A Transfer-Encoding other than `chunked` alone (`gzip, chunked`: aiohttp reads the chunks and
    passes the gzip bytes on as they are, which then failed as JSON) is InvalidInput naming it."""
    if header is None:
        return
    codings = [coding.strip().lower() for coding in header.split(",")]
    if codings != ["chunked"]:
        raise InvalidInput(f"Transfer-Encoding {header_shown(header)} is not supported here; send the body "
                           "chunked or with a Content-Length, compressed (if at all) as its Content-Encoding")


def _inflater(request: web.Request) -> Inflater | None:
    """The body's Inflater, if it is compressed and aiohttp has not inflated it already (the server's
    connections leave it to us, app.py; aiohttp's test server does not: its stream then says how
    many compressed bytes it took in, `total_compressed_bytes`)."""
    encoding = body_encoding(request.headers.get("Content-Encoding"))
    if encoding is None or getattr(request.content, "total_compressed_bytes", None) is not None:
        return None
    return Inflater(encoding)


async def _read_within(request: web.Request, limit: int, count: json_values.ValueCount, whom: str) -> bytes:
    """The body a step at a time (a chunk as it arrives, or at most STEP bytes inflated of a
    compressed one), refused once past `limit`, or once its JSON values counted so far (`count`)
    pass the budget for good. The loop yields after each step: readany does not when data is
    buffered (and beside a burst of small requests, a victim's p50 was 2x worse without these
    yields). Not `request.read()`: that raises the stream's buffer to the body limit first. The
    steps are kept apart and joined once at the end: a body grown in place is copied as it grows,
    and a refused one is never copied whole."""
    parts, size = [], 0
    _check_transfer_coding(request.headers.get("Transfer-Encoding"))
    inflater = _inflater(request)
    drain = request.content_length is not None  # and at most `limit` (read_body): the rest is bounded
    while data := await request.content.readany():
        for part in (inflater.steps(data, STEP) if inflater is not None else (data,)):
            size += len(part)
            if size > limit:
                raise BodyTooLarge(f"the request body is over the server's limit of {limit} bytes "
                                   "(--max-body-bytes)", drain)
            count.feed(part)
            if count.final:
                raise BodyRefused(count.refusal("the request body", whom), drain)
            parts.append(part)
            await asyncio.sleep(0)
    if inflater is not None:
        inflater.finish()
    return b"".join(parts)


def parse_json(body: bytes, what: str):
    """`body` as JSON, or InvalidInput saying why not, naming `what`."""
    try:
        return strict_loads(body)
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} is not valid UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what} is not valid JSON: {error_text(exc)}") from None


async def loads(request: web.Request, body: bytes, what: str):
    """`parse_json(body, what)`, in the application's JSON worker process when `body` is large
    (json_worker.py), so that the event loop does not wait for it."""
    worker = request.app.get(JSON_WORKER)
    if worker is None or len(body) < LARGE:
        return parse_json(body, what)
    return await worker.loads(body, what, parse_json)


async def read_json(request: web.Request, config: ServerConfig, budget: json_values.Budget = json_values.Budget()):
    """The body (within the limits of `read_body`, `budget` JSON values among them) as JSON, or
    InvalidInput saying why not."""
    return await loads(request, await read_body(request, config, budget), "the request body")


async def read_options(request: web.Request, config: ServerConfig, what: str, example: str) -> dict:
    """An optional JSON object body (none: {}), else InvalidInput naming `what` with an `example`."""
    body = await read_body(request, config)
    options = parse_json(body, what) if body.strip() else {}
    if not isinstance(options, dict):
        raise InvalidInput(f"{what} must be a JSON object like {example}")
    return options


def error_response(exc: BaseException) -> web.Response:
    """`{"error": ...}` with the status of `exc` (status.py); internal errors are logged. After a body
    refused before its end (BodyRefused) or too slow, part of it is unread: the connection cannot
    carry another request. The answer says `Connection: close`; aiohttp sends it, reads and drops
    the rest of a body that may be drained (`BodyRefused.drain`: as sent, never inflated, within
    --read-timeout-s, app.py) and closes the connection. Any other is marked UNREAD, so that the
    application closes the connection as soon as the answer is sent."""
    status = answer_status(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status.http == 401 else None
    response = web.json_response({"error": status.message}, status=status.http, headers=headers)
    if status.outcome == "read_timeout" or isinstance(exc, BodyRefused):
        response.force_close()
        if not getattr(exc, "drain", False):
            response[UNREAD] = True
    return response
