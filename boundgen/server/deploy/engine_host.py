"""The engine process's side of the link: one queue per model, fed by every front end.

    front-end connection (a reader thread each)
        SUBMIT -> a constrained request's allow-list -> its trie, here (LocalEngine.enqueue; unknown
                  ids: 400, the words of one process); admission: draining? 503; else the
                  model's batcher queue (LocalEngine.enqueue:
                  the one queue, fair across the clients the front ends name; full at --max-queue:
                  429, or a greedier client's newest request gets it: runtime/fair_queue.py;
                  a client with requests waiting, or an address refused many times in a moment
                  (admission.RecentRefusals), gets its 429 --refusal-hold-ms late, from the
                  held-answers thread, as in one process: server/admission.py; sent at once when
                  its front end or the engine starts draining);
                  a batch worker takes it into a call
        CANCEL -> withdraw it from the queue at once (a request already in a call runs to the end)
    batch worker: the call's rows -> the outbox; the sender thread packs each RESULT frame for its
                  front end's connection, whose own writer thread writes it, while the worker
                  starts the next call
    connection closed (front end died): everything it had queued is withdrawn
    pinger thread: PING to every front end each link.PING_INTERVAL_S; a front end answers from its event
                  loop, so one that is ready but has not answered for a while is stuck (`stuck`:
                  frontends.py kills and restarts it, or its share of new connections would hang)

Nothing here tokenizes or builds texts: requests arrive as token ids and leave as result rows
(link.py). The deadline a request brings is checked by the batcher when it takes a call, so a
request never runs after it. A constrained beam model's catalogue is loaded here, with its
artifact (its engine factory loads it, as in one process); the front ends know the model is
constrained from its spec (ALLOW_ITEMS in, ITEM_IDS out) and the catalogue's item count from
`_describe`, and never load the catalogue. An allow-list's trie is derived on its front end's
reader thread (on CUDA: K binary searches and the path table's rows, on the catalogue's stream),
as one process derives it on the request's thread; a named subset's was derived at load.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from boundgen.errors import BoundgenError, Cancelled, DeadlineExceeded, InvalidInput, Overloaded
from boundgen.runtime.local_engine import CallShare, LocalEngine
from boundgen.server.admission import RecentRefusals, refusal_hold
from boundgen.server.deploy import link
from boundgen.text.tokenizer import PackedBatch

log = logging.getLogger("boundgen.server")


@dataclass
class HostedModel:
    name: str
    engine: LocalEngine
    source: str  # the artifact directory


@dataclass
class _Connection:
    """One front end's link. Frames are packed by whoever sends, and written in order: at once by the sender
    while the socket takes them without blocking, else by the connection's own writer thread. A front end
    that stops reading (stopped, stuck) fills its socket and blocks only its own writer, never the answers
    to the other front ends (the sender and held-answer threads are shared)."""
    sock: socket.socket
    index: int
    tickets: dict = field(default_factory=dict)  # request id -> (model, Ticket), while queued or running
    lock: threading.Lock = field(default_factory=threading.Lock)
    state: str = ""  # the front end's last STATE, its index and its process id
    frontend: int | None = None
    pid: int | None = None
    unanswered: float | None = None  # time.monotonic() of the oldest PING sent and not yet answered
    outgoing: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # frames; None: stop writing
    pending: int = 0  # frames handed to the writer thread and not yet written (under write_lock)
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    def start_writer(self) -> None:
        threading.Thread(target=self._write, name=f"boundgen-link-write-{self.index}", daemon=True).start()

    def send(self, message: dict) -> None:
        """Write `message` at once when the writer thread has nothing pending and the socket takes it whole
        without blocking (an answer's usual way: one thread wake-up fewer), else hand it, or what the socket
        did not take, to the writer thread."""
        data = link.frame(message)
        with self.write_lock:  # never held across a write that may block
            if not self.pending:
                try:
                    sent = self.sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return  # the front end is gone; its reader thread cleans up
                if sent == len(data):
                    return
                data = data[sent:]
            self.pending += 1
            self.outgoing.put(data)

    def stop_writer(self) -> None:
        self.outgoing.put(None)

    def _write(self) -> None:
        while (data := self.outgoing.get()) is not None:
            try:
                self.sock.sendall(data)
            except OSError:
                return  # the front end is gone; its reader thread cleans up
            with self.write_lock:
                self.pending -= 1


class EngineHost:
    def __init__(self, path: str, max_queue: int, refusal_hold_s: float = 0.0):
        """`path`: the Unix socket to listen on; `max_queue`: requests waiting per model beyond
        which new ones get 429 (serve's --max-queue); `refusal_hold_s`: how late that 429 goes to a
        client that already has requests waiting (serve's --refusal-hold-ms)."""
        self.path, self.max_queue, self.refusal_hold_s = path, max_queue, refusal_hold_s
        self._held: list = []  # (when, order, connection, message): answers sent late, soonest first
        self._held_order = itertools.count()
        self._held_changed = threading.Condition()
        self._refusals = RecentRefusals(refusal_hold_s)  # by address, across the front ends
        self.models: dict[str, HostedModel] = {}
        self.state = "loading"
        self.frontend_states: dict[int, str] = {}
        self._ready_pids: set[int] = set()  # the front-end processes that have said "ready"
        self._connections: list[_Connection] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o600)  # only this user's processes may submit
        self._listener.listen(64)
        self._closed = False
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (connection, request id, future) to answer
        threading.Thread(target=self._accept, name="boundgen-link-accept", daemon=True).start()
        threading.Thread(target=self._send_results, name="boundgen-link-send", daemon=True).start()
        threading.Thread(target=self._send_held, name="boundgen-link-held", daemon=True).start()
        self._pinged = time.monotonic()  # the pinger's last round
        threading.Thread(target=self._ping, name="boundgen-link-ping", daemon=True).start()

    # ---- the engine process's side ------------------------------------------------------------

    def add(self, name: str, engine: LocalEngine, source: str) -> None:
        with self._lock:
            self.models[name] = HostedModel(name, engine, source)

    def set_state(self, state: str) -> None:
        """loading -> ready (the models are loaded: the front ends read their tokenizers) -> serving
        (every front end has said ready: they admit requests) -> draining, told to every front end;
        draining sends the held refusals."""
        with self._lock:
            self.state = state
            connections = list(self._connections)
        for conn in connections:
            conn.send(self._models_message())
        if state == "draining":
            self._flush_held()

    def wait_frontends(self, count: int, state: str, timeout_s: float) -> bool:
        """Wait until `count` front ends say `state` (listening, ready); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: sum(s == state for s in self.frontend_states.values()) >= count, timeout_s)

    def was_ready(self, pid: int) -> bool:
        """Whether the front-end process `pid` ever said it was ready."""
        with self._lock:
            return pid in self._ready_pids

    def stuck(self, after_s: float) -> list[int]:
        """Process ids of the ready front ends that have left a PING unanswered for `after_s` seconds; none
        while the pinger itself is late (this process was stopped or starved: no verdict from it)."""
        now = time.monotonic()
        if now - self._pinged > 2 * link.PING_INTERVAL_S:
            return []
        with self._lock:
            return [c.pid for c in self._connections if c.state == "ready" and c.pid is not None
                    and c.unanswered is not None and now - c.unanswered > after_s]

    def close(self) -> None:
        self._closed = True
        self._flush_held()
        try:
            self._listener.close()
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # ---- connections --------------------------------------------------------------------------

    def _models_message(self) -> dict:
        return {"op": link.MODELS, "state": self.state, "models": [_describe(m) for m in self.models.values()]}

    def _accept(self) -> None:
        index = 0
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            conn = _Connection(sock, index)
            conn.start_writer()
            index += 1
            with self._lock:
                self._connections.append(conn)
                hello = self._models_message()
            conn.send(hello)
            threading.Thread(target=self._serve, args=(conn,), name=f"boundgen-link-{conn.index}",
                             daemon=True).start()

    def _serve(self, conn: _Connection) -> None:
        try:
            while True:
                message = link.read_frame(conn.sock)
                if message is None:
                    break
                op = message.get("op")
                if op == link.SUBMIT:
                    self._submit(conn, message)
                elif op == link.CANCEL:
                    self._cancel(conn, message["id"])
                elif op == link.PONG:
                    conn.unanswered = None
                elif op == link.STATE:
                    with self._changed:
                        self.frontend_states[message["frontend"]] = message["state"]
                        conn.state, conn.frontend, conn.pid = message["state"], message["frontend"], message.get("pid")
                        if conn.state == "ready":
                            self._ready_pids.add(conn.pid)
                        self._changed.notify_all()
                    if message["state"] == "draining":  # its drain waits for nothing held here
                        self._flush_held(conn)
        except (OSError, ConnectionError, ValueError) as exc:
            # A front end that exits as it drains may reset its link: no news then
            level = logging.INFO if "draining" in (conn.state, self.state) else logging.WARNING
            log.log(level, "the link of front end %s (connection %d) broke: %s",
                    "?" if conn.frontend is None else conn.frontend, conn.index, exc)
        finally:
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            with conn.lock:
                queued = list(conn.tickets.values())
                conn.tickets.clear()
            for model, ticket in queued:  # its clients are gone with it
                ticket.cancelled.set()
                model.engine.withdraw(ticket)
            conn.stop_writer()
            conn.sock.close()

    def _submit(self, conn: _Connection, message: dict) -> None:
        rid = message["id"]
        model = self.models.get(message["model"])
        if model is None:
            return conn.send(_error(rid, "unavailable", f"model {message['model']} is not loaded in the engine"))
        if self.state not in ("ready", "serving"):
            return conn.send(_error(rid, "unavailable", "the server is shutting down and admits no new requests"
                                    if self.state == "draining" else "the server is still loading its models"))
        tokens = link.unpack_array(message["tokens"])
        cu = link.unpack_array(message["cu_seqlens"])
        packed = PackedBatch(tokens=torch.from_numpy(tokens.astype(np.int64)),
                             positions=torch.from_numpy(link.unpack_array(message["positions"]).astype(np.int64)),
                             cu_seqlens=torch.from_numpy(cu.astype(np.int32)), lengths=list(message["lengths"]))
        allow, subset = message.get("allow_items"), message.get("allow_subset")
        cancelled = threading.Event()
        try:
            ticket = model.engine.enqueue(packed, message.get("deadline"), cancelled, str(message.get("client", "")),
                                          self.max_queue, None if allow is None else link.unpack_array(allow),
                                          None if subset is None else str(subset))
        except BoundgenError as exc:
            overloaded = isinstance(exc, Overloaded)
            hold = refusal_hold(self.refusal_hold_s, exc.client_waiting if overloaded else 0, message.get("deadline"),
                                overloaded and self._refusals.note(str(message.get("source", ""))))
            if hold:
                return self._hold(conn, _error(rid, _kind(exc), str(exc)), hold)
            return conn.send(_error(rid, _kind(exc), str(exc)))
        except RuntimeError as exc:  # the engine is closed
            return conn.send(_error(rid, "unavailable", str(exc)))
        with conn.lock:
            conn.tickets[rid] = (model, ticket)
        ticket.future.add_done_callback(lambda f: self._outbox.put((conn, rid, f)))

    def _hold(self, conn: _Connection, message: dict, seconds: float) -> None:
        with self._held_changed:
            heapq.heappush(self._held, (time.monotonic() + seconds, next(self._held_order), conn, message))
            self._held_changed.notify()

    def _send_held(self) -> None:
        """One thread sends every held answer when its time comes (a timer each would be a thread
        each, and a greedy client may hold hundreds)."""
        while True:
            with self._held_changed:
                while not self._held or self._held[0][0] > time.monotonic():
                    self._held_changed.wait(self._held[0][0] - time.monotonic() if self._held else None)
                _, _, conn, message = heapq.heappop(self._held)
            conn.send(message)

    def _flush_held(self, conn: _Connection | None = None) -> None:
        """Send the held answers (to `conn`'s front end; None: to all) now, as one process's
        Admission.close does: a draining front end or engine keeps no refusal back."""
        with self._held_changed:
            now = [entry for entry in self._held if conn is None or entry[2] is conn]
            self._held = [entry for entry in self._held if not (conn is None or entry[2] is conn)]
            heapq.heapify(self._held)
            self._held_changed.notify()
        for _, _, to, message in sorted(now, key=lambda entry: entry[:2]):
            to.send(message)

    def _cancel(self, conn: _Connection, rid: int) -> None:
        with conn.lock:
            held = conn.tickets.get(rid)
        if held is not None:
            model, ticket = held
            ticket.cancelled.set()
            model.engine.withdraw(ticket)

    def _ping(self) -> None:
        while not self._closed:
            time.sleep(link.PING_INTERVAL_S)
            now = time.monotonic()
            # Overslept: this process was stopped or starved, so the pings' ages say nothing of the front ends
            # (their PONGs may wait unread, behind what they sent meanwhile): every count starts again.
            overslept = now - self._pinged > 2 * link.PING_INTERVAL_S
            self._pinged = now
            with self._lock:
                connections = list(self._connections)
            for conn in connections:
                if overslept or conn.unanswered is None:  # set before the PING goes: its PONG may come at once
                    conn.unanswered = now
                conn.send({"op": link.PING})

    def _send_results(self) -> None:
        while True:
            conn, rid, future = self._outbox.get()
            try:
                self._answer(conn, rid, future)
            except Exception:  # one bad answer must not stop the others
                log.exception("could not answer request %s", rid)

    def _answer(self, conn: _Connection, rid: int, future) -> None:
        with conn.lock:
            conn.tickets.pop(rid, None)
        error = future.exception()
        if error is not None:
            if not isinstance(error, BoundgenError):
                log.error("model call failed", exc_info=error)
            return conn.send(_error(rid, _kind(error), str(error) or type(error).__name__))
        share: CallShare = future.result()
        conn.send({"op": link.RESULT, "id": rid, "rows": [link.pack_array(np.asarray(r)) for r in share.rows],
                   "queue_s": share.queue_s, "model_s": share.model_s, "requests_in_call": share.requests_in_call})


def _kind(exc: BaseException) -> str:
    if isinstance(exc, InvalidInput):
        return "invalid"
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if isinstance(exc, Cancelled):
        return "cancelled"
    return "internal"


def _error(rid: int, kind: str, message: str) -> dict:
    return {"op": link.ERROR, "id": rid, "kind": kind, "message": message}


def _describe(model: HostedModel) -> dict:
    """What a front end needs to serve a model: its program, where its tokenizer is, load-time facts
    (a constrained model's catalogue: its item count, the allow-list bound the front end checks)."""
    spec, tokenizer = model.engine.spec, model.engine.packer.tokenizer
    if tokenizer.source is None:
        raise BoundgenError(f"model {model.name}: its tokenizer was not loaded from a directory, so the "
                            "front-end processes cannot load it; serve it with --frontends 1")
    catalogue = getattr(model.engine, "catalogue", None)  # a constrained beam model's (None: none)
    return {"name": model.name, "source": model.source, "spec": spec.to_dict(),
            "tokenizer_dir": str(tokenizer.source), "tokenizer_options": tokenizer.options,
            "catalogue_items": None if catalogue is None else catalogue.items}
