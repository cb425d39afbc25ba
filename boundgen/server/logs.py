"""What a server writes about itself, and in which format.

Two streams:
- status lines on stdout (`Server.say`): "boundgen serve: listening http=H:P grpc=H:P", models
  loaded, draining, stopped. Tools wait for them (server/deploy/launch.py waits for LISTENING);
- log records on stderr (`logging`, logger "boundgen.server"): warnings, errors, and with
  `--access-log` one INFO record per inference request (logger "boundgen.access").

`--log-format text` (the default): status lines as they are, records as
"2026-11-30 21:37:00,123 boundgen.server WARNING message". `--log-format json`: every line on
both streams is one JSON object {"ts": ISO 8601 UTC, "level", "logger", "msg"} (access records
add ACCESS_FIELDS), for log collectors; a status line's text is its "msg".

An access record names the request (its id: request_ids.py, the client's X-Request-ID or
x-request-id, else a new one, as echoed back), its route, what it was answered (HTTP status or
gRPC code), the model, the outcome (metrics.py's label) and its time in the server:
    text: boundgen.access INFO http POST /v2/models/m/infer 200 m success 1.234 ms id=3f2a...
    json: {..., "request_id", "route", "status", "model", "protocol", "outcome", "ms"}

A running server's format and level are its `LogSettings`, which Triton's log settings call
changes (triton_extensions.py; HTTP /v2/logging, gRPC LogSettings): `apply()` reconfigures the
process's logging, and status lines follow the new format.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from dataclasses import dataclass

from boundgen.server import request_ids
from boundgen.server.status import answered

LEVELS = ("debug", "info", "warning", "error")  # most verbose first
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
ACCESS = logging.getLogger("boundgen.access")
ACCESS_FIELDS = ("request_id", "route", "status", "model", "protocol", "outcome", "ms")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                    timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        line.update({k: getattr(record, k) for k in ACCESS_FIELDS if hasattr(record, k)})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str = "text", level: str = "info") -> None:
    """Log records to stderr in `log_format`, from `level` up (the process's one logging setup).
    Status lines on stdout are not records: every level writes them."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@dataclass
class LogSettings:
    """A server's log format (FORMATS) and level (LEVELS) as it runs. `apply()` configures the
    process's logging (`configure`: the root logger), in whatever process runs the server."""
    format: str = "text"
    level: str = "info"

    def apply(self) -> None:
        configure(self.format, self.level)


def status_line(message: str, log_format: str = "text") -> str:
    """A status line for stdout, as `log_format` writes it."""
    if log_format == "json":
        return json.dumps({"ts": _now(), "level": "INFO", "logger": "boundgen.serve", "msg": message},
                          ensure_ascii=False)
    return message


def status_text(line: str) -> str:
    """The message of a status line in either format (what a tool reading stdout compares)."""
    if line.startswith("{"):
        try:
            return str(json.loads(line).get("msg", ""))
        except (ValueError, AttributeError):
            return line
    return line


def access(model: str, protocol: str, outcome: str, seconds: float) -> None:
    """One access record (logged only with --access-log: the caller decides), for the request
    being handled (request_ids.current(): its id and route; "-" outside one)."""
    ms = round(seconds * 1e3, 3)
    tag = request_ids.current()
    request_id, route = (tag.id, tag.route) if tag is not None else ("-", "-")
    status = answered(outcome, protocol)
    ACCESS.info("%s %s %s %s %s %.3f ms id=%s", protocol, route, status, model or "-", outcome, ms, request_id,
                extra={"request_id": request_id, "route": route, "status": status, "model": model,
                       "protocol": protocol, "outcome": outcome, "ms": ms})
