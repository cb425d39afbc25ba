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

Nothing waits for a pipe: a pipe that nobody reads (a log shipper that hung, a pipe left open)
takes no more once full, and a write to it waits for as long. Lines for a pipe (records, and
status lines by `say`) are queued, QUEUE_LINES at most, for one writer thread per stream
(`LineWriter`): that thread alone waits; past the bound lines are dropped and counted, and once the
pipe takes lines again the writer says how many ("boundgen: N lines dropped: <stderr> was not
read"). A process writes what is queued at exit for up to FLUSH_S. Lines for a file or a terminal
are written at once, as before.

A running server's format and level are its `LogSettings`, which Triton's log settings call
changes (triton_extensions.py; HTTP /v2/logging, gRPC LogSettings): `apply()` reconfigures the
process's logging, and status lines follow the new format.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import queue
import stat
import sys
import threading
import time
from dataclasses import dataclass

from boundgen.server import request_ids
from boundgen.server.status import answered

LEVELS = ("debug", "info", "warning", "error")  # most verbose first
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
ACCESS = logging.getLogger("boundgen.access")
ACCESS_FIELDS = ("request_id", "route", "status", "model", "protocol", "outcome", "ms")
QUEUE_LINES = 10_000  # lines waiting for a stream at most; more are dropped and counted
FLUSH_S = 2.0  # at exit, the longest wait for the queued records to be written
REPORT_S = 1.0  # while lines are dropped, how often the writer says how many


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


class LineWriter:
    """The lines of one stream, written by a thread of its own: `write` queues a line without waiting
    (a full queue of `capacity` lines drops it and counts it); the thread writes each whole line
    straight to the stream's file descriptor (not through the stream: a write stuck on a full pipe
    must not hold the stream's lock, which the interpreter's exit and anything else writing to it
    would wait for), and reports the drops since its last report once the queue is empty again or
    every REPORT_S while drops go on ("boundgen: N lines dropped: stderr was not read", in the
    process's format). `close` lets it write what is queued for up to FLUSH_S."""

    def __init__(self, stream, capacity: int = QUEUE_LINES):
        self.stream, self.queue = stream, queue.Queue(capacity)
        self._sink = _sink(stream)
        self._drops, self._drops_lock = 0, threading.Lock()
        self._thread = threading.Thread(target=self._run, name="boundgen-line-writer", daemon=True)
        self._thread.start()

    def dropped(self) -> int:
        """Lines dropped so far."""
        return self._drops

    def write(self, line: str) -> None:
        try:
            self.queue.put_nowait(line)
        except queue.Full:
            with self._drops_lock:
                self._drops += 1

    def _run(self) -> None:
        reported, reported_at = 0, time.monotonic()
        while True:
            line = self.queue.get()  # None: close() asks it to stop
            try:
                if line is not None:
                    self._sink(line + "\n")
                dropped = self._drops
                if dropped > reported and (line is None or self.queue.empty()
                                           or time.monotonic() - reported_at >= REPORT_S):
                    name = getattr(self.stream, "name", "the stream").strip("<>")
                    self._sink(status_line(f"boundgen: {dropped - reported} lines dropped: {name} was not read",
                                           _format) + "\n")
                    reported, reported_at = dropped, time.monotonic()
            except (OSError, ValueError):  # a closed stream or a reader gone: nothing more can be written
                return
            if line is None:
                return

    def close(self, timeout_s: float = FLUSH_S) -> None:
        """Write what is queued, for up to `timeout_s` (the writer stops after it)."""
        end = time.monotonic() + timeout_s
        if self._thread.is_alive():
            try:
                self.queue.put(None, timeout=timeout_s)
                self._thread.join(max(0.0, end - time.monotonic()))
            except queue.Full:
                pass


def _sink(stream):
    """How a LineWriter writes a line to `stream`: os.write on its file descriptor, the whole line
    (the stream's own buffer flushed first, so that what it held comes before), in its encoding;
    a stream without one (a test's) through its write and flush."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        def write(text: str) -> None:
            stream.write(text)
            stream.flush()
        return write
    stream.flush()
    encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(text: str) -> None:
        data = memoryview(text.encode(encoding, errors="backslashreplace"))
        while data:
            data = data[os.write(fd, data):]
    return write


_writers: dict[int, LineWriter] = {}  # by the file descriptor a stream writes to
_writers_lock = threading.Lock()
_format = "text"  # the process's log format, for the writers' own lines


def line_writer(stream) -> LineWriter:
    """The process's one LineWriter for the file `stream` writes to (created at first use)."""
    fd = stream.fileno()
    with _writers_lock:
        if fd not in _writers:
            if not _writers:
                atexit.register(flush)
            _writers[fd] = LineWriter(stream)
        return _writers[fd]


def flush(timeout_s: float = FLUSH_S) -> None:
    """Write what every LineWriter holds, for up to `timeout_s` in all, and stop them (at exit)."""
    end = time.monotonic() + timeout_s
    for writer in list(_writers.values()):
        writer.close(max(0.0, end - time.monotonic()))


def is_pipe(stream) -> bool:
    """Whether `stream` writes to a pipe (or a FIFO): the one kind of file whose writes wait, for as
    long as nobody reads it."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's buffer), or closed
        return False


def say(stream, line: str) -> None:
    """A status line on `stream`: to a pipe through its LineWriter (never waiting for a reader), else
    written and flushed at once. The caller serialises its own lines (one write a line here)."""
    if is_pipe(stream):
        line_writer(stream).write(line)
    else:
        stream.write(line + "\n")
        stream.flush()


class LineHandler(logging.Handler):
    """Log records formatted by the thread that logs them and written as `say` writes a line: to a pipe
    by its LineWriter, so that logging never waits for a reader (a full queue drops the line, and the
    writer says how many it dropped); to a file or a terminal at once."""

    def __init__(self, stream=None):
        super().__init__()
        self.stream = stream or sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # arguments that do not fit the message: both as they are, not a traceback
            line = f"{record.levelname} {record.msg!r} % {record.args!r}"
        say(self.stream, line)


def configure(log_format: str = "text", level: str = "info") -> None:
    """Log records to stderr in `log_format`, from `level` up (the process's one logging setup), by a
    `LineHandler`. Status lines on stdout are not records: every level writes them."""
    global _format
    _format = log_format
    handler = LineHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@dataclass
class LogSettings:
    """A server's log format (FORMATS) and level (LEVELS) as it runs. `apply()` configures the
    process's logging (`configure`: the root logger), in whatever process runs the server.
    `fixed`: why they cannot change while it runs (None: they can)."""
    format: str = "text"
    level: str = "info"
    fixed: str | None = None

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
