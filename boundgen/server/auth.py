"""The optional API key: `Authorization: Bearer KEY` (HTTP header; gRPC metadata `authorization`).

Required on every route except the server health checks (HTTP /v2/health/live and
/v2/health/ready, gRPC ServerLive and ServerReady), so that probes need no secret.
"""

from __future__ import annotations

import hmac

from boundgen.server.status import Unauthenticated

SCHEME = "Bearer "


def check_api_key(expected: str | None, authorization: str | None) -> None:
    """Raise Unauthenticated unless `authorization` is "Bearer <expected>" (or no key is configured)."""
    if expected is None:
        return
    if not authorization:
        raise Unauthenticated("this server needs an API key: send 'Authorization: Bearer <key>'")
    presented = authorization[len(SCHEME):] if authorization.startswith(SCHEME) else ""
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise Unauthenticated("wrong API key (expected 'Authorization: Bearer <key>')")
