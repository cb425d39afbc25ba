"""Large JSON bodies parsed in a worker process, off the event loop.

`json.loads` holds the GIL from start to end (a thread would block the event loop just as long):
a body within its value count but large, one 4 MB string, took 5-25 ms on the 2-core VM in one
step of the event loop, 10-70 ms with its bytes decoded and its tensors built in the same step.
A body of at least LARGE bytes goes to a worker process instead (`python -m
boundgen.server.json_worker`, one per serving process, started at its first such body; it imports
json, pickle and boundgen's errors, not torch): the event loop writes the bytes to the worker's stdin and
reads the value back, pickled, from its stdout, a pipe's worth a step, each copied into place in
a buffer it keeps, and unpickles it (a copy of its strings: ~2 ms for 4 MB on 2 cores). The worker parses one body at a time, in turn.

The answer is what `parse_json` (http_bodies.py) gives in the server: the value, or the same
InvalidInput messages; the worker has its server's limit on integer digits (app.py). A value
pickle cannot carry (nested past its recursion limit) is parsed in the server as before; so is
every body while the worker cannot be started or has died (it is started again for the next),
and a body the worker has not answered within ANSWER_S of taking it (a worker stopped or starved:
it is killed, so that the bodies behind it do not wait on it too; a 4 MB body takes it ~0.1 s).

    request:  8-byte big-endian length, the body
    answer:   8-byte big-endian length, pickle of (kind, detail): ("ok", value), ("utf8", ""),
              ("json", the decoder's message) or ("again", "")
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import pickle
import sys

from boundgen.errors import InvalidInput

log = logging.getLogger("boundgen.server")
LARGE = 1 << 18  # bytes: below this a body is parsed in the server (~1 ms); the round trip would cost more
PIPE_BYTES = 1 << 18  # written to the worker, and read back, a step at a time
ANSWER_S = 5.0  # a body the worker has not answered within this long of taking it is parsed in the server


class JsonWorker:
    """The serving process's side: `await loads(body, what)`."""

    def __init__(self, answer_s: float = ANSWER_S):
        self.answer_s = answer_s
        self._proc: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None  # made on the event loop that uses it
        self._stopped: list[asyncio.subprocess.Process] = []
        # The answers are read into this buffer, kept from one to the next (the largest answer's size: bodies are
        # within --max-body-bytes): the parts joined were the answer's size in fresh memory written in one step
        # of the loop, ~2.4 ms for 4 MB on 2 cores, and a victim's p99 beside 4 MB bodies 3.0-3.4x -> 2.6-2.8x
        self._answer = bytearray()

    async def loads(self, body: bytes, what: str, parse):
        """`body` parsed in the worker, with the errors of `parse(body, what)` (http_bodies.parse_json),
        which parses it here when the worker cannot. A caller cancelled meanwhile (its client went
        away) leaves the exchange to finish, so that the pipes stay in step."""
        kind, detail = await asyncio.shield(asyncio.ensure_future(self._exchange(body)))
        if kind == "ok":
            return detail
        if kind == "again":
            return parse(body, what)
        if kind == "utf8":
            raise InvalidInput(f"{what} is not valid UTF-8")
        raise InvalidInput(f"{what} is not valid JSON: {detail}")

    async def _exchange(self, body: bytes) -> tuple[str, object]:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # one body at a time on the pipes
            try:
                proc = await self._running()
                size = await asyncio.wait_for(self._ask(proc, body), self.answer_s)
                return pickle.loads(memoryview(self._answer)[:size])
            except asyncio.TimeoutError:
                log.warning("the JSON worker did not answer within %g s; parsing here", self.answer_s)
                self._stop()
                return "again", None
            except (OSError, EOFError, asyncio.IncompleteReadError, pickle.UnpicklingError) as exc:
                log.warning("the JSON worker failed (%s); parsing here", exc)
                self._stop()
                return "again", None
            except BaseException:  # the server is stopping: the pipes hold half a message
                self._stop()
                raise

    async def _ask(self, proc: asyncio.subprocess.Process, body: bytes) -> int:
        """Send `body`, read the answer into `_answer`: its size."""
        proc.stdin.write(len(body).to_bytes(8, "big"))
        view = memoryview(body)
        for start in range(0, len(body), PIPE_BYTES):  # a whole body buffered at once would be
            proc.stdin.write(view[start:start + PIPE_BYTES])  # moved down at every write the pipe takes
            await proc.stdin.drain()
        size = int.from_bytes(await proc.stdout.readexactly(8), "big")
        if len(self._answer) < size:
            self._answer = bytearray(size)
        for start in range(0, size, PIPE_BYTES):  # a pipe's worth a step, copied into place
            part = await proc.stdout.readexactly(min(size - start, PIPE_BYTES))
            self._answer[start:start + len(part)] = part
        return size

    async def close(self, *_) -> None:
        """Stop the worker (an aiohttp on_cleanup callback: its argument, the app, is not needed)."""
        self._stop()
        for proc in self._stopped:
            await proc.wait()
        self._stopped.clear()

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, str(digits), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, env=env, limit=1 << 20)
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            self._stopped = [p for p in self._stopped if p.returncode is None] + [self._proc]  # `close` waits
        self._proc = None


def strict_loads(body: bytes):
    """`json.loads`, refusing what RFC 8259 has not and Python's reader takes: NaN, Infinity, -Infinity,
    and a number too large for a float (1e999, read as inf). ValueError names it."""
    return json.loads(body, parse_constant=_no_constant, parse_float=_finite)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def error_text(exc: BaseException) -> str:
    """A JSON reader's error as a client reads it: Python's advice on its integer digit limit left out."""
    return str(exc).split("; use sys.set_int_max_str_digits")[0]


def serve(digits: int, stdin=None, stdout=None) -> None:
    """The worker: parse bodies from `stdin` until it closes (the server is gone), answer on `stdout`."""
    stdin, stdout = stdin or sys.stdin.buffer, stdout or sys.stdout.buffer
    if digits and hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(digits)
    while len(head := stdin.read(8)) == 8:
        body = stdin.read(int.from_bytes(head, "big"))
        try:
            answer = ("ok", strict_loads(body))
        except UnicodeDecodeError:
            answer = ("utf8", "")
        except (ValueError, RecursionError) as exc:
            answer = ("json", error_text(exc))
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except (RecursionError, pickle.PicklingError):
            data = pickle.dumps(("again", ""))
        stdout.write(len(data).to_bytes(8, "big"))
        stdout.write(data)
        stdout.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
