"""Server settings: one frozen dataclass, checked at construction. Only the CLI fills it from flags."""

from __future__ import annotations

from dataclasses import dataclass

from boundgen.server.logs import FORMATS, LEVELS
from boundgen.server.request_ids import CLIENT_KEYS, DEFAULT_CLIENT_KEY

API_KEY_ENV = "BOUNDGEN_API_KEY"
API_KEY_HEADER = "Authorization"  # "Authorization: Bearer KEY" (HTTP header; gRPC metadata key "authorization")
SHM_PREFIX = "/boundgen"  # the shared memory objects clients may register by default (shared_memory.py)
# --frontend-hang-s: at least three of the engine process's pings (one a second); on a 2-core host a front end
# under a burst of 1,500 requests answered one 0.6 s late, and 0.3 s killed healthy front ends
MIN_FRONTEND_HANG_S = 3.0


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000  # 0: any free port (printed when listening)
    grpc_port: int = 8001  # 0: any free port
    max_inflight: int | None = None  # per model; None: the engine's own concurrency
    max_queue: int = 32  # per model: requests waiting for an in-flight slot
    # A full queue's 429 to a client that already has requests waiting comes this late (admission.py): a burst
    # client's victim 6.7-7.1x -> 1.8-2.1x its p50 alone on 2 cores, the burst itself served more (2026-12-06).
    refusal_hold_ms: float = 100.0
    # Who a request's client is, for fair queueing (server/request_ids.py client_key): "address-id", the hosts in
    # turn, then a host's X-Client-ID / x-client-id clients (its address when it sends none); "id", every id its own
    # turn; "address", the address alone (docs/serving.md, starvation).
    client_key: str = DEFAULT_CLIENT_KEY
    default_timeout_ms: float = 1000.0  # deadline of a request that brings none
    max_body_bytes: int = 4 << 20  # HTTP body / gRPC message
    api_key: str | None = None  # required on every route but /v2/health/{live,ready} when set
    drain_timeout_s: float = 30.0  # SIGTERM: longest wait for running and queued requests
    idle_timeout_s: float = 30.0  # close a connection without a whole request head for this long (connections.py)
    read_timeout_s: float = 10.0  # an HTTP inference body must arrive in full within this long of its head
    max_connections: int = 1024  # HTTP connections open at once; one more is answered 503 and closed
    log_format: str = "text"  # "text" | "json": server log lines (server/logs.py)
    log_level: str = "info"  # least severe log record written: debug | info | warning | error
    access_log: bool = False  # one log line per inference request (model, protocol, outcome, ms)
    model_repository: str | None = None  # load may replace a model from DIR/name (server/kserve/repository.py)
    # A front-end process encodes a request's texts on this many threads (--frontends > 1). 4: served W1 on the
    # H200 host, c=1 9.9 -> 7.8 ms, within the budget 228.0 -> 230.0 QPS (2026-12-02, 8a966e5, docs/benchmarks.md).
    tokenize_threads: int = 4
    # A ready front-end process that has answered none of the engine process's pings (one a second, answered
    # from its event loop) for this long is killed and restarted (--frontends > 1); 0: never.
    frontend_hang_s: float = 10.0  # >= MIN_FRONTEND_HANG_S
    allow_client_shm: bool = False  # clients may register system shared memory regions (server/kserve/shared_memory.py)
    shm_prefix: str = SHM_PREFIX  # ... only of objects whose key starts with this ("/": any object)

    def __post_init__(self):
        for name in ("http_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        if self.http_port and self.http_port == self.grpc_port:
            raise ValueError(f"HTTP and gRPC need different ports, both are {self.http_port}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if not isinstance(self.tokenize_threads, int) or not 1 <= self.tokenize_threads <= 64:
            raise ValueError(f"tokenize_threads must be an integer from 1 to 64, got {self.tokenize_threads!r}")
        if not (self.frontend_hang_s == 0 or MIN_FRONTEND_HANG_S <= self.frontend_hang_s < float("inf")):
            raise ValueError(f"frontend_hang_s must be 0 (never) or a number of seconds >= {MIN_FRONTEND_HANG_S:g} "
                             f"(a front end's answer to a ping may take most of a second under a burst), "
                             f"got {self.frontend_hang_s}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if not 0 <= self.refusal_hold_ms <= 10_000:
            raise ValueError(f"refusal_hold_ms must be from 0 to 10000, got {self.refusal_hold_ms}")
        if self.client_key not in CLIENT_KEYS:
            raise ValueError(f"client_key must be one of {', '.join(CLIENT_KEYS)}, got {self.client_key!r}")
        if self.default_timeout_ms <= 0:
            raise ValueError(f"default_timeout_ms must be > 0, got {self.default_timeout_ms}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.api_key is not None and (not self.api_key.strip() or self.api_key != self.api_key.strip()):
            raise ValueError(f"the API key (--api-key, or {API_KEY_ENV}) must not be empty, blank or begin or end "
                             "with spaces (leave it unset to serve without a key)")
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()):
            raise ValueError("api_key must be printable ASCII: it travels in an HTTP header")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        for name in ("idle_timeout_s", "read_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.shm_prefix.startswith("/") or "/" in self.shm_prefix[1:] or "\0" in self.shm_prefix:
            raise ValueError(f"shm_prefix must be '/' or the start of a shared memory object's name like "
                             f"'/boundgen' (one leading '/', no other), got {self.shm_prefix!r}")
        if self.log_level not in LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}")
        if self.log_format not in FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(FORMATS)}, got {self.log_format!r}")
