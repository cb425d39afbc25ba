"""The link between front-end processes and the engine process: messages on a Unix socket.

    front end -> engine   SUBMIT  {id, model, deadline, client, source, tokens, positions, cu_seqlens, lengths
                                   [, allow_items, allow_subset]}  (a constrained beam request's
                                   allow-list, int64 [K]; its named subset, a text)
                          CANCEL  {id}                 (client gone, or its deadline passed)
                          STATE   {frontend, state, pid}  (the front end is listening / ready / draining)
                          PONG    {}                   (an answer to PING, from the front end's event loop)
    engine -> front end   MODELS  {state, models: [{name, source, spec, ...}]}  (on connect, on change)
                          RESULT  {id, rows, queue_s, model_s, requests_in_call}
                          ERROR   {id, kind, message}  (kind: a status name, see ERROR_KINDS)
                          PING    {}                   (every PING_INTERVAL_S: is the front end's loop turning?)

A frame is a 4-byte little-endian length and a msgpack map. Arrays travel as raw bytes with
their dtype and shape (`pack_array` / `unpack_array`): token ids, allow-lists and result rows
are never per-item Python objects. `client` names who sent the request (its address or
X-Client-ID, the same in every front end), so that the engine's queue takes clients in turn. Deadlines are
`time.monotonic()` seconds: CLOCK_MONOTONIC is one clock for every process of a Linux host, so
a front end's deadline means the same in the engine.
"""

from __future__ import annotations

import socket
import struct

import msgpack
import numpy as np

SUBMIT, CANCEL, STATE, MODELS, RESULT, ERROR = "submit", "cancel", "state", "models", "result", "error"
PING, PONG = "ping", "pong"
PING_INTERVAL_S = 1.0
ERROR_KINDS = ("invalid", "overloaded", "deadline", "cancelled", "unavailable", "internal")
_LEN = struct.Struct("<I")
MAX_FRAME = 256 << 20  # a frame longer than this is a broken peer, not a request


def native_msgpack() -> bool:
    """Whether msgpack runs its C extension here. Without it (a msgpack built for another Python, or
    MSGPACK_PUREPYTHON) it falls back to pure Python: a W2 submit or result frame packed and unpacked
    takes ~64 us against ~4 us (2-core EPYC), ~0.12 ms a request under the GIL of the engine process
    and of its front end; under W2 load on an H100 host (2026-12-06) the engine process spent a fifth
    of its Python samples in the fallback."""
    return msgpack.Packer.__module__ != "msgpack.fallback"  # msgpack picks its Packer at import


def pack_array(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"dt": a.dtype.str, "sh": list(a.shape), "b": a.tobytes()}


def unpack_array(d: dict) -> np.ndarray:
    return np.frombuffer(d["b"], dtype=np.dtype(d["dt"])).reshape(d["sh"])


def frame(message: dict) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return _LEN.pack(len(body)) + body


def decode(body: bytes) -> dict:
    return msgpack.unpackb(body, raw=False)


def read_frame(sock: socket.socket) -> dict | None:
    """The next message from a blocking socket; None once the peer has closed it."""
    head = _read_exactly(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ConnectionError(f"a link frame of {n} bytes (limit {MAX_FRAME}): the peer is broken")
    body = _read_exactly(sock, n)
    if body is None:
        return None
    return decode(body)


async def read_frame_async(reader) -> dict | None:
    """The next message from an asyncio StreamReader; None once the peer has closed it."""
    try:
        head = await reader.readexactly(_LEN.size)
        (n,) = _LEN.unpack(head)
        if n > MAX_FRAME:
            raise ConnectionError(f"a link frame of {n} bytes (limit {MAX_FRAME}): the peer is broken")
        return decode(await reader.readexactly(n))
    except EOFError:  # asyncio.IncompleteReadError is one
        return None


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)
