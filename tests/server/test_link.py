"""The front-end <-> engine link's frames (server/deploy/link.py): arrays travel whole and exact,
a closed peer reads as None, a frame over the limit is refused."""

import asyncio
import socket

import numpy as np
import pytest

from boundgen.server.deploy import link


def test_frames_round_trip_arrays_and_end_at_close():
    a, b = socket.socketpair()
    ids = np.arange(-3, 12, dtype=np.int32).reshape(3, 5)
    scores = np.linspace(-9, 0, 7, dtype=np.float32)
    a.sendall(link.frame({"op": link.RESULT, "id": 7, "rows": [link.pack_array(ids), link.pack_array(scores)]}))
    a.close()
    message = link.read_frame(b)
    assert message["op"] == link.RESULT and message["id"] == 7
    got = [link.unpack_array(r) for r in message["rows"]]
    np.testing.assert_array_equal(got[0], ids)
    assert got[0].dtype == np.int32 and got[1].dtype == np.float32
    np.testing.assert_array_equal(got[1], scores)
    assert link.read_frame(b) is None


def test_an_oversized_frame_is_refused():
    a, b = socket.socketpair()
    a.sendall((link.MAX_FRAME + 1).to_bytes(4, "little"))
    with pytest.raises(ConnectionError, match="broken"):
        link.read_frame(b)


def test_async_reader_reads_the_same_frames():
    async def main():
        r, w = socket.socketpair()
        reader, _ = await asyncio.open_unix_connection(sock=r)
        w.sendall(link.frame({"op": link.MODELS, "state": "ready", "models": []}))
        first = await link.read_frame_async(reader)
        w.close()
        return first, await link.read_frame_async(reader)

    first, second = asyncio.run(main())
    assert first == {"op": link.MODELS, "state": "ready", "models": []} and second is None


def test_native_msgpack_says_whether_the_c_extension_runs():
    """The project's environments install msgpack's wheel (the link's frames cost ~16x as much without
    it); with MSGPACK_PUREPYTHON msgpack runs its fallback, and the check says so (serve then warns)."""
    import os
    import subprocess
    import sys

    assert link.native_msgpack()
    code = "from boundgen.server.deploy import link; print(link.native_msgpack())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MSGPACK_PUREPYTHON": "1"})
    assert out.stdout.strip() == "False", out.stderr
