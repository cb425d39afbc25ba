"""Compressed HTTP request bodies (Content-Encoding gzip, deflate, br) inflated a bounded step at a time.

aiohttp inflates a body inside the connection's data callback when left to it: each chunk a
handler takes from the body stream makes it inflate the next ones until the stream's buffer is
full again, 0.5-2 MiB of output per step of the event loop for a deflate bomb (5-20 ms each on a
2-core VM), which every other request waits for. The server turns that off (app.py:
`auto_decompress=False`) and server/http_bodies.read_body inflates here instead: `Inflater.steps`
gives at most `step` bytes per item, so the reader counts each, yields to the event loop between
them and stops at its limit, having inflated at most limit + step bytes.

Encodings as aiohttp reads them: the header's value, lowercased, is one of gzip, deflate (a zlib
stream, or raw deflate when the first byte is not a zlib header, as browsers send it) or br
(when the `brotli` module is installed); any other value leaves the body as it is. Concatenated
gzip or deflate members are inflated one after the other.
"""

from __future__ import annotations

import zlib
from typing import Iterator

from boundgen.errors import InvalidInput

try:  # optional, as for aiohttp: Content-Encoding br only where the brotli module is installed
    import brotli
except ImportError:  # pragma: no cover - brotli comes with the server's dependencies here
    brotli = None

ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})  # the ones aiohttp's parser recognises


def body_encoding(header: str | None) -> str | None:
    """The compression a Content-Encoding header's value names (None: the body is as sent, no header or
    `identity`). Any other value (an unknown coding, several codings, `gzip, gzip`) is InvalidInput:
    taken as identity, its compressed bytes reached the JSON parser as text and its bounds as if inflated."""
    encoding = (header or "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ENCODINGS:
        return encoding
    raise InvalidInput(f"Content-Encoding {header_shown(header)} is not supported here; send one coding of "
                       "gzip, deflate or br, or none")


def header_shown(header: str) -> str:
    """A client's header value in a message: as sent when printable ASCII, escaped otherwise, cut short."""
    return (header if header.isascii() and header.isprintable() else ascii(header))[:80]


class Inflater:
    """One compressed body's inflation: `steps(data)` for each chunk as it arrives, then `finish()`."""

    def __init__(self, encoding: str):
        if encoding == "br" and brotli is None or encoding == "zstd":
            raise InvalidInput(f"Content-Encoding {encoding} is not supported here; send gzip, deflate or none")
        self.encoding = encoding
        self._brotli = brotli.Decompressor() if encoding == "br" else None
        self._zlib = None  # the zlib member being inflated (created at its first byte: deflate's header decides)
        self.inflated = 0  # bytes given so far

    def steps(self, data: bytes, step: int) -> Iterator[bytes]:
        """What `data` (the next compressed bytes of the body) inflates to, at most `step` bytes an
        item; a consumer that stops early leaves the rest uninflated."""
        try:
            parts = self._brotli_steps(data, step) if self._brotli is not None else self._zlib_steps(data, step)
            for part in parts:
                self.inflated += len(part)
                yield part
        except (zlib.error, getattr(brotli, "error", zlib.error)) as exc:
            raise InvalidInput(f"the request body is not valid {self.encoding} (Content-Encoding): {exc}") from None

    def finish(self) -> None:
        """InvalidInput if the compressed stream stopped before its end."""
        done = self._brotli.is_finished() if self._brotli is not None else self._zlib is None or self._zlib.eof
        if not done:
            raise InvalidInput(f"the request body's {self.encoding} stream (Content-Encoding) ends before its end")

    def _zlib_steps(self, data: bytes, step: int) -> Iterator[bytes]:
        while data:
            if self._zlib is None or self._zlib.eof:  # a new member
                self._zlib = zlib.decompressobj(self._wbits(data))
            out = self._zlib.decompress(data, step)
            data = self._zlib.unconsumed_tail or (self._zlib.unused_data if self._zlib.eof else b"")
            if out:
                yield out
            while len(out) == step and not self._zlib.eof and not self._zlib.unconsumed_tail:
                out = self._zlib.decompress(b"", step)  # output zlib still holds for this input
                if out:
                    yield out

    def _wbits(self, first: bytes) -> int:
        if self.encoding == "gzip":
            return 16 + zlib.MAX_WBITS
        return zlib.MAX_WBITS if first[0] & 0x0F == 8 else -zlib.MAX_WBITS  # zlib header, else raw deflate

    def _brotli_steps(self, data: bytes, step: int) -> Iterator[bytes]:
        out = self._brotli.process(data, output_buffer_limit=step)
        while True:
            for start in range(0, len(out), step):  # its buffer stops growing past the limit, not at it
                yield out[start:start + step]
            if self._brotli.is_finished() or len(out) < step and self._brotli.can_accept_more_data():
                return  # (a full buffer may leave output behind even when it takes more input)
            out = self._brotli.process(b"", output_buffer_limit=step)
