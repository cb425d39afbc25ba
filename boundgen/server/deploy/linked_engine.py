"""A front-end process's engines: tokenize here, call the engine process over the link, build results here.

    ServedModel.run (event loop)
      -> LinkedEngine.run: RequestPacker.encode (bounds, template, token ids)        "pre"
           (a constrained beam request: its allow-list's length against the catalogue's items)
      -> EngineLink.call: SUBMIT on the link (token ids, the allow-list as raw arrays, a subset by name);
           await RESULT or ERROR (the engine derives the allow-list's trie: unknown ids
           come back as InvalidInput, the words of one process)                     "queue" + "model"
           deadline passes first, or the client goes away: CANCEL (the engine withdraws it,
           unrun, if it still waits), 504 / nothing
      -> ScoreResultBuilder / BeamResultBuilder: rows -> result (candidate texts decoded here;
           a constrained model's item ids are one of its rows)                      "post"

The engine process does only batching, staging, program calls and copying rows back
(engine_host.py); everything that grows with text, and every protocol, runs in the N front-end
processes, each with its own GIL. Admission is the engine's: one queue per model (429 when full).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

import numpy as np

from boundgen.artifact.tasks import task_of
from boundgen.errors import Cancelled, DeadlineExceeded, InvalidInput
from boundgen.runtime.catalogue import check_allow_count
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.local_engine import CallShare
from boundgen.runtime.requests import RequestPacker, make_builder
from boundgen.server.deploy import link
from boundgen.server.signature import EngineCall
from boundgen.server.status import Overloaded, Unavailable
from boundgen.text.tokenizer import Tokenizer

log = logging.getLogger("boundgen.server")
_ERRORS = {"invalid": InvalidInput, "overloaded": Overloaded, "deadline": DeadlineExceeded,
           "cancelled": Cancelled, "unavailable": Unavailable}


class EngineGone(Exception):
    """The engine process closed the link: this front end cannot serve any more."""


class EngineLink:
    """One front end's connection to the engine process (asyncio, on the front end's event loop)."""

    def __init__(self, path: str, frontend: int):
        self.path, self.frontend = path, frontend
        self.state = "connecting"
        self.models: dict[str, dict] = {}  # name -> {"source", "spec", ...} from the engine's MODELS
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._writer = None
        self._changed: asyncio.Event | None = None
        self.closed: asyncio.Event | None = None

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path, limit=link.MAX_FRAME)
        self._changed, self.closed = asyncio.Event(), asyncio.Event()
        asyncio.ensure_future(self._read(reader))

    def tell(self, state: str) -> None:
        """Say this front end's state (listening, ready, draining) to the engine process."""
        self._send({"op": link.STATE, "frontend": self.frontend, "state": state, "pid": os.getpid()})

    async def wait_state(self, *states: str) -> str:
        while self.state not in states:
            if self.closed.is_set():
                raise EngineGone("the engine process closed the link")
            self._changed.clear()
            await self._changed.wait()
        return self.state

    async def call(self, model: str, packed, deadline: float, client: str = "",
                   allow_items: np.ndarray | None = None, allow_subset: str | None = None, source: str = "") -> dict:
        """Queue one tokenized request in the engine and await its RESULT; raises the engine's
        error, DeadlineExceeded when `deadline` passes first (it is withdrawn there, unrun, if it
        still waits), and sends CANCEL if the caller is cancelled. `client`: who sent it (its
        turn in the engine's queue); `allow_items`, `allow_subset`: a constrained request's
        allow-list and named subset; `source`: its address (refusals held by address too)."""
        if self.closed.is_set():
            raise Unavailable("the engine process has stopped; this server is shutting down")
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending[rid] = future
        message = {"op": link.SUBMIT, "id": rid, "model": model, "deadline": deadline, "client": client,
                   "source": source,
                   "tokens": link.pack_array(packed.tokens.numpy().astype("<i4")),
                   "positions": link.pack_array(packed.positions.numpy().astype("<i4")),
                   "cu_seqlens": link.pack_array(packed.cu_seqlens.numpy().astype("<i4")),
                   "lengths": list(packed.lengths)}
        if allow_items is not None:
            message["allow_items"] = link.pack_array(np.asarray(allow_items, dtype="<i8"))
        if allow_subset is not None:
            message["allow_subset"] = allow_subset
        self._send(message)
        # A timer fails the future at the deadline, and the future is awaited as it is: the answer wakes this
        # coroutine in one turn of the loop (wait_for over a shield took three).
        expiry = loop.call_later(max(0.0, deadline - time.monotonic()), _expire, future)
        try:
            return await future
        except _Expired:
            self._send({"op": link.CANCEL, "id": rid})
            raise DeadlineExceeded("the deadline passed while the request waited for model "
                                   f"{model}; it was not run, or its answer came too late and was dropped") from None
        except asyncio.CancelledError:
            self._send({"op": link.CANCEL, "id": rid})
            raise
        finally:
            expiry.cancel()
            self._pending.pop(rid, None)

    def _send(self, message: dict) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(link.frame(message))

    async def _read(self, reader) -> None:
        try:
            while True:
                message = await link.read_frame_async(reader)
                if message is None:
                    break
                op = message.get("op")
                if op == link.PING:  # answered here, on the event loop: a loop that is stuck answers nothing
                    self._send({"op": link.PONG})
                    continue
                if op == link.MODELS:
                    self.state = message["state"]
                    self.models = {m["name"]: m for m in message["models"]}
                    self._changed.set()
                    continue
                future = self._pending.get(message.get("id"))
                if future is None or future.done():
                    continue  # its caller gave up (deadline, client gone)
                if op == link.RESULT:
                    future.set_result(message)
                else:
                    error = _ERRORS.get(message.get("kind"), RuntimeError)
                    _fail(future, error(message.get("message", "the engine failed the request")))
        except (ConnectionError, ValueError, OSError) as exc:
            log.error("the link to the engine process broke: %s", exc)
        finally:
            self.closed.set()
            self._changed.set()
            for future in self._pending.values():
                if not future.done():
                    _fail(future, Unavailable("the engine process stopped while the request was in it"))


class _Expired(Exception):
    """A request's deadline passed before its answer came (EngineLink.call's timer)."""


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(_Expired())


def _fail(future: asyncio.Future, error: BaseException) -> None:
    """Fail a request's future, its exception marked as seen: a caller that awaits it still gets it, and one
    that is gone (cancelled as the answer came, or its task dropped as the loop stops) leaves no "Future
    exception was never retrieved" in the log (under overload: a line a refused request)."""
    future.set_exception(error)
    future.exception()


class LinkedEngine(Engine):
    """An artifact served from this front end: its tokenizer and result builder here, its program in the
    engine process. `run` is a coroutine (ServedModel awaits it on the event loop: no thread hop)."""

    runs_async = True

    def __init__(self, engine_link: EngineLink, hosted: dict, tokenize_threads: int = 1):
        """`hosted`: the engine process's description of the model (engine_host._describe);
        `tokenize_threads`: threads a request's texts are encoded on (serve --tokenize-threads).
        A constrained beam model (its spec says so) takes allow-lists and returns item ids; its
        catalogue stays in the engine process, which says only how many items it holds."""
        self.link = engine_link
        self.spec = EngineSpec.from_dict(hosted["spec"])
        program = self.spec.program
        options = {**hosted["tokenizer_options"], "threads": tokenize_threads}
        tokenizer = Tokenizer.from_dir(hosted["tokenizer_dir"], **options)
        self.packer = RequestPacker(tokenizer, program)  # tokens only: the engine pads and stages
        self.builder = make_builder(program, tokenizer, items=task_of(program).constrained(program))
        self.catalogue_items = hosted.get("catalogue_items")  # None: no catalogue (the engine says so)

    async def run(self, call: EngineCall, deadline: float, client: str = "", source: str = ""):
        t0 = time.perf_counter()
        packed = (self.packer.pack_ids([list(ids) for ids in call.token_ids]) if call.token_ids is not None
                  else self.packer.encode(list(call.texts)))
        if call.allow_items is not None and self.catalogue_items is not None:  # before it crosses the link
            check_allow_count(len(call.allow_items), self.catalogue_items)
        t1 = time.perf_counter()
        answer = await self.link.call(self.spec.name, packed, deadline, client, call.allow_items, call.allow_subset,
                                      source)
        t2 = time.perf_counter()
        share = CallShare([link.unpack_array(r) for r in answer["rows"]], answer["queue_s"], answer["model_s"],
                          answer["requests_in_call"])
        result = self.builder.build(*share.rows)
        end = time.perf_counter()
        result.timings = {"pre": t1 - t0, **share.timings(), "post": end - t2, "total": end - t0,
                          "input_tokens": packed.num_tokens,
                          # to the engine process and back: the link, its threads' wake-ups, (de)serialising
                          "link": max(0.0, (t2 - t1) - share.queue_s - share.model_s)}
        return result
