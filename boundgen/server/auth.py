"""The optional API key: `Authorization: Bearer KEY` (HTTP header; gRPC metadata `authorization`).

Required on every route except the server health checks (HTTP /v2/health/live and
/v2/health/ready, gRPC ServerLive and ServerReady), so that probes need no secret.
A request with two or more Authorization headers (metadata entries) is refused over both
protocols: HTTP libraries read the first and gRPC's the last, so which one counts would be
ambiguous. A header that is not ASCII is a wrong key (401), whatever bytes it holds: HTTP
servers hand such bytes over as text that may not even encode back to UTF-8.
"""

from __future__ import annotations

import hmac

from typing import Sequence

from boundgen.server.status import Unauthenticated

SCHEME = "Bearer "


def check_api_key(expected: str | None, headers: Sequence[str]) -> None:
    """Raise Unauthenticated unless `headers` (every Authorization value the request carries) is
    exactly one "Bearer <expected>" (or no key is configured)."""
    if expected is None:
        return
    if len(headers) > 1:
        raise Unauthenticated(f"the request has {len(headers)} Authorization headers; send exactly one "
                              "'Authorization: Bearer <key>'")
    authorization = headers[0] if headers else None
    if not authorization:
        raise Unauthenticated("this server needs an API key: send 'Authorization: Bearer <key>'")
    if not authorization.isascii():  # a key is ASCII; other bytes (or undecodable ones) cannot match it
        raise Unauthenticated("wrong API key: the Authorization header holds characters that are not ASCII "
                              "(expected 'Authorization: Bearer <key>')")
    presented = authorization[len(SCHEME):] if authorization.startswith(SCHEME) else ""
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise Unauthenticated("wrong API key (expected 'Authorization: Bearer <key>')")
