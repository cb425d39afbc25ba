"""How many values a JSON body holds, counted from its bytes as they arrive, before it is parsed.

`json.loads` of a 4 MB body of a million one-character strings holds the event loop (and the GIL:
a thread would not help) 50-90 ms, a body of two million integers longer still; such a request is
then refused for its count anyway. Every route serves requests of a bounded number of values (a
score model's samples or token ids, a beam route's prompts, and the names, shapes and parameters
around them: `budget`), so http_bodies.read_body counts a body's values as each chunk arrives
(`ValueCount.feed`: a few C-speed passes over the chunk, `bytes.count`, `replace`, `split`; no
step of the event loop longer than a chunk's), and a body with more than its route's budget is
refused (400) without being parsed. Counting stops at the budget: a flood costs a chunk's count.

The count is a lower bound of the values of the JSON text, so a request within the budget is
never refused:

    escapes out:  pairs of backslashes, then escaped quotes (left to right, as JSON reads them; a
                  run of backslashes at a chunk's end waits for the next chunk): every quote
                  left delimits a string, and the quotes seen so far say whether a chunk starts
                  inside one
    strings     = quotes / 2
    values     >= 1 + the commas and colons outside strings    (an array of k values has k - 1
                                                                commas, an object of k members
                                                                holds 2k values in k - 1 commas
                                                                and k colons; the root is the 1)
                  and >= strings

It is short of the exact count by one per non-empty array or object. A body that is not valid
JSON may be counted wrong, and is refused either way (400). UTF-16 and UTF-32 bodies (json.loads
reads them) are counted by their quote, comma and colon bytes too, which may be more than their
characters: such a body is counted from its UTF-8 once it has arrived (`ValueCount.recount`).

The same pass bounds each string's length from below: every text a route serves is bounded in
tokens, so in bytes (server/signature.py: a token is at most `max_token_bytes` of UTF-8), and a
body holding a longer string is refused as soon as that string has arrived past the bound, before
the body is joined, parsed or its string decoded (a 4 MB one-string body cost the event loop ~5 ms
in those steps, 2026-12-06). Only strings of more than json_worker.LARGE bytes are refused here:
a shorter one is cheap to parse, and the signature's check refuses it with the sample it is. So
that many shorter strings cannot do what one long one cannot, all strings together are held to
the most a request's texts can hold in all (a score request's total token limit; the prompts a
beam route takes at once) plus LARGE for the rest (names, parameters). Keys are strings too: no
route's keys are that long.

The bytes outside strings (numbers, punctuation, whitespace) are held to OUTSIDE_PER_VALUE a value of
the budget plus OUTSIDE_BASE: no field takes a number longer than 24 characters, so a body past that
holds numbers no request has (300 shape dimensions of 4,000 digits: few values, 1.2 MB that
json.loads takes ~20 ms over, in the worker or on the loop) or more whitespace than any request's
layout, and is refused as it arrives like a flood.

A string's UTF-8 is at least its JSON bytes less 5 a backslash: an escape is at most 6 bytes
(backslash, u, four hex digits) and stands for at least one byte, the rest is the UTF-8 itself
(the escaped quotes and backslashes taken out above count 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from boundgen.artifact.tasks import task_named, task_of
from boundgen.errors import InvalidInput
from boundgen.server.json_worker import LARGE

ENVELOPE = 1024  # values a request may hold besides its texts, token ids or prompts (names, shapes, parameters)
# Bytes outside strings (numbers, punctuation, whitespace) a body may hold: OUTSIDE_PER_VALUE a value
# of its budget (a number of int64 or double is at most 24 characters; the rest is room for the
# separators and an indented layout) plus OUTSIDE_BASE. A body past it holds numbers no field
# takes (300 dimensions of 4,000 digits: 1.2 MB that json.loads takes 21 ms over) or more
# whitespace than any request needs, and is refused before it is parsed.
OUTSIDE_PER_VALUE = 64
OUTSIDE_BASE = 64 << 10


@dataclass(frozen=True)
class Budget:
    """What a route's body may hold: `values` JSON values, no string longer than `longest` bytes of
    UTF-8 (the longest text) and no more than `total` in all (the texts of a request); None: any."""

    values: int = ENVELOPE
    longest: int | None = None
    total: int | None = None


class ValueCount:
    """The values of a JSON text fed a chunk at a time, up to `budget` (then `over`); only its
    first `json_bytes` bytes are JSON when given (the binary tensor extension's header). With
    `longest`, also whether a string is longer than that many bytes of UTF-8 and than LARGE
    (`too_long`); with `total`, whether the strings hold more than `total` + LARGE bytes in all
    (`too_much`); either makes it `over` (the module docstring)."""

    def __init__(self, budget: int, json_bytes: int | None = None, longest: int | None = None,
                 total: int | None = None):
        self.budget, self.left, self.longest, self.total = budget, json_bytes, longest, total
        self._bound = None if longest is None else max(longest, LARGE)  # the module docstring
        self.too_long = 0  # a string's UTF-8 bytes, at least, once one is proven over `_bound`
        self._open = 0  # the string the last chunk ended in: its UTF-8 bytes so far, at least
        self.string_bytes = 0  # the UTF-8 bytes of all strings so far, at least
        self.too_much = 0  # `string_bytes` once over `total` + LARGE
        self.outside_bytes = 0  # bytes outside strings so far
        self.too_wide = 0  # `outside_bytes` once over what the budget's values can take (OUTSIDE_PER_VALUE)
        self.values = 1  # the lower bound so far (module docstring): the larger of
        self.strings, self._separated = 0, 1  # strings, and 1 + commas + colons outside strings
        self._json_bytes = json_bytes
        self._quotes = 0
        self._pending = b""  # a run of backslashes that ended the last chunk
        self._head = b""  # the JSON's first 4 bytes, which tell its encoding (json.detect_encoding)

    @property
    def over(self) -> bool:
        return self.values > self.budget or bool(self.too_long or self.too_much or self.too_wide)

    @property
    def final(self) -> bool:
        """Over the budget for good: the JSON is UTF-8, so no `recount` can lower the count, and the
        rest of the body cannot either (the count only grows)."""
        return self.over and len(self._head) == 4 and json.detect_encoding(self._head).startswith("utf-8")

    def feed(self, chunk: bytes) -> None:
        if self.over or self.left == 0:
            return
        if self.left is not None:
            chunk, self.left = chunk[:self.left], max(0, self.left - len(chunk))
        if len(self._head) < 4:
            self._head += chunk[:4 - len(self._head)]
        data = self._pending + chunk if self._pending else chunk
        if b"\\" in data:
            kept = data.rstrip(b"\\")
            data, self._pending = kept.replace(b"\\\\", b"").replace(b'\\"', b""), data[len(kept):]
        quotes = data.count(b'"')
        inside = self._quotes % 2  # this chunk starts inside a string
        self._quotes += quotes
        self.strings = self._quotes // 2
        if self.strings > self.budget:
            self.values = self.strings
            return
        parts = data.split(b'"') if quotes else [data]
        if self.longest is not None:
            self._measure(parts[1 - inside::2], inside, self._quotes % 2)
        outside = b"".join(parts[inside::2])
        self.outside_bytes += len(outside)
        if self.outside_bytes > OUTSIDE_PER_VALUE * self.budget + OUTSIDE_BASE:
            self.too_wide = self.outside_bytes
        self._separated += outside.count(b",") + outside.count(b":")
        self.values = max(self._separated, self.strings)
        if self.total is not None:  # the bytes inside strings, less 5 a backslash (_at_least)
            self.string_bytes += len(data) - len(outside) - quotes - 5 * data.count(b"\\")
            if self.string_bytes > self.total + LARGE:
                self.too_much = self.string_bytes

    def _measure(self, strings: list[bytes], inside: int, ends_inside: int) -> None:
        """The chunk's string parts (the first continues the open string when `inside`; the last is
        left open when `ends_inside`), each string's UTF-8 bytes bounded from below."""
        carried = self._open if inside else 0
        if not strings or max(map(len, strings)) + carried <= self._bound:  # no part long enough (most chunks)
            if ends_inside:
                self._open = (carried if len(strings) == 1 else 0) + _at_least(strings[-1])
            return
        for k, part in enumerate(strings):
            length = (carried if k == 0 else 0) + _at_least(part)
            if length > self._bound:
                self.too_long = length
                return
        self._open = length if ends_inside else 0

    def recount(self, body: bytes) -> None:
        """Count the whole body again, in UTF-8, when it is UTF-16 or UTF-32 (the module docstring)."""
        text = body[:self._json_bytes] if self._json_bytes is not None else body
        encoding = json.detect_encoding(text[:4])
        if not encoding.startswith("utf-8"):
            again = ValueCount(self.budget, longest=self.longest, total=self.total)
            again.feed(text.decode(encoding, "replace").encode())
            self.values, self.strings = again.values, again.strings
            self.too_long, self.too_much, self.too_wide = again.too_long, again.too_much, again.too_wide

    def check(self, what: str, whom: str) -> None:
        """InvalidInput if over the budget: `what` the body is, `whom` the budget is for."""
        if self.over:
            raise InvalidInput(self.refusal(what, whom))

    def refusal(self, what: str, whom: str) -> str:
        """Why a body over the budget is refused: `what` the body is, `whom` the budget is for."""
        if self.too_long:
            return (f"{what} holds a string of at least {self.too_long} bytes, longer than any text a request to "
                    f"{whom} can hold ({self.longest} bytes: its token limit times the longest token's bytes); "
                    f"it was refused before it was parsed")
        if self.too_much:
            return (f"{what} holds at least {self.too_much} bytes of strings, more than the texts of a request to "
                    f"{whom} can hold ({self.total} bytes: its token limits times the longest token's bytes) and "
                    f"{LARGE} bytes of other strings; it was refused before it was parsed")
        if self.too_wide and self.values <= self.budget:
            return (f"{what} holds at least {self.too_wide} bytes outside strings (numbers, punctuation, whitespace), "
                    f"more than the {self.budget} values a request to {whom} can hold take "
                    f"({OUTSIDE_PER_VALUE} bytes a value and {OUTSIDE_BASE}); it was refused before it was parsed")
        return (f"{what} holds at least {self.values} JSON values, more than the {self.budget} a "
                f"request to {whom} can hold; it was refused before it was parsed")


def _at_least(part: bytes) -> int:
    """The UTF-8 bytes a string's JSON bytes `part` stand for, at least (the module docstring)."""
    return len(part) - 5 * part.count(b"\\") if b"\\" in part else len(part)


def budget(models, name: str | None = None, task: str | None = None) -> Budget:
    """What a request's body may hold for the served model `name`, else for the most generous served
    model of `task` (any task when None): ENVELOPE plus the most values a request needs, and strings
    no longer than its longest text (server/signature.py); `models` is a server.models.ModelSet."""
    served = models.models
    chosen = ([served[name]] if name in served else
              [m for m in served.values() if task is None or task_of(m.engine.spec) is task_named(task)])
    if not chosen:
        return Budget()
    return Budget(ENVELOPE + max(_needs(m) for m in chosen), max(m.signature.max_text_bytes for m in chosen),
                  max(_text_bytes(m) for m in chosen))


def _text_bytes(model) -> int:
    """The UTF-8 bytes the texts of a request for `model` (a ServedModel) can hold in all, on any route."""
    program = model.engine.spec.program
    return task_of(program).text_tokens(program, _admitted(model)) * model.signature.max_token_bytes


def _needs(model) -> int:
    """Values a request for `model` (a ServedModel) needs on any route besides the envelope."""
    program = model.engine.spec.program
    return task_of(program).json_values(program, _admitted(model))


def _admitted(model) -> int:
    """The requests the server admits to `model` at once: in flight and queued."""
    return model.admission.max_inflight + model.admission.max_queue
