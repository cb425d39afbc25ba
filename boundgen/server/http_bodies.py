"""HTTP request bodies and error answers, for every route (KServe v2's and the JSON routes):
a body read whole within the server's limits (--max-body-bytes, inflated for a compressed one;
--read-timeout-s), a JSON body, and the JSON error body `{"error": "..."}` with the status of
status.py. KServe v2's inference bodies (JSON and binary tensor data, shared memory
references): kserve/http_messages.py.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from boundgen.errors import InvalidInput
from boundgen.server import json_values
from boundgen.server.config import ServerConfig
from boundgen.server.status import ReadTimeout, answer_status


UNREAD = web.ResponseKey("unread_body", bool)  # part of the request body was left unread (see `error_response`)


class BodyTooLarge(InvalidInput):
    """The body (inflated, for a compressed one) passed --max-body-bytes: reading stopped there."""


async def read_body(request: web.Request, config: ServerConfig, budget: int = json_values.ENVELOPE,
                    whom: str | None = None, header_length: str | None = None) -> bytes:
    """The whole body, within --max-body-bytes (else BodyTooLarge, a 400) and --read-timeout-s (else
    ReadTimeout). A compressed body (Content-Encoding gzip, deflate) counts inflated: aiohttp inflates
    it a bounded chunk at a time as it is read, and reading stops at the limit. Its JSON (all of it,
    or the `header_length` bytes the binary extension's header gives) holds at most `budget` values
    (json_values.py: counted as it arrives), else InvalidInput naming `whom` (a route, a model) once
    all of it has arrived, unparsed."""
    limit = config.max_body_bytes
    count = json_values.ValueCount(budget, _json_part(header_length))
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the request body is {request.content_length} bytes, over the server's limit "
                           f"of {limit} (--max-body-bytes)")
    try:  # the whole body within --read-timeout-s: a stalled or endless one must not hold the connection
        body = await asyncio.wait_for(_read_within(request, limit, count), config.read_timeout_s)
    except asyncio.TimeoutError:
        raise ReadTimeout(f"the request body did not arrive in full within {config.read_timeout_s:g} s "
                          "(--read-timeout-s)") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the request body is over the server's limit of {limit} bytes "
                           "(--max-body-bytes)") from None
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


async def _read_within(request: web.Request, limit: int, count: json_values.ValueCount) -> bytes:
    """The body a chunk at a time, refused once past `limit`. Not `request.read()`: that raises
    the stream's buffer to the body limit first, so a compressed body is inflated several MiB per
    step of the event loop, past the limit before the size is looked at (a 64 KiB deflate body was
    inflated to all of its 64 MiB, about 0.25 s of a blocked event loop, for each such request).
    At the stream's default buffer each chunk is at most a few hundred KiB inflated, and the loop
    yields after each (readany does not when data is buffered, and reading a chunk inflates the next).
    Each chunk's JSON values are counted as it arrives (`count`)."""
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the request body is over the server's limit of {limit} bytes (--max-body-bytes)")
        count.feed(chunk)
        await asyncio.sleep(0)
    return bytes(body)


def parse_json(body: bytes, what: str):
    """`body` as JSON, or InvalidInput saying why not, naming `what`."""
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} is not valid UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


async def read_json(request: web.Request, config: ServerConfig, budget: int = json_values.ENVELOPE):
    """The body (within the limits of `read_body`, `budget` JSON values among them) as JSON, or
    InvalidInput saying why not."""
    return parse_json(await read_body(request, config, budget), "the request body")


async def read_options(request: web.Request, config: ServerConfig, what: str, example: str) -> dict:
    """An optional JSON object body (none: {}), else InvalidInput naming `what` with an `example`."""
    body = await read_body(request, config)
    options = parse_json(body, what) if body.strip() else {}
    if not isinstance(options, dict):
        raise InvalidInput(f"{what} must be a JSON object like {example}")
    return options


def error_response(exc: BaseException) -> web.Response:
    """`{"error": ...}` with the status of `exc` (status.py); internal errors are logged. After a body
    too large or too slow, part of it is unread: the connection cannot carry another request, and
    the response is marked UNREAD so that the application closes the connection once it is sent
    (else aiohttp would read, and inflate, the rest of the body for up to 10 s to keep it alive)."""
    status = answer_status(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status.http == 401 else None
    response = web.json_response({"error": status.message}, status=status.http, headers=headers)
    if status.outcome == "read_timeout" or isinstance(exc, BodyTooLarge):
        response.force_close()
        response[UNREAD] = True
    return response
