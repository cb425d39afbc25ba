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
"""

from __future__ import annotations

import json

from boundgen.artifact.tasks import task_named, task_of
from boundgen.errors import InvalidInput

ENVELOPE = 1024  # values a request may hold besides its texts, token ids or prompts (names, shapes, parameters)


class ValueCount:
    """The values of a JSON text fed a chunk at a time, up to `budget` (then `over`); only its
    first `json_bytes` bytes are JSON when given (the binary tensor extension's header)."""

    def __init__(self, budget: int, json_bytes: int | None = None):
        self.budget, self.left = budget, json_bytes
        self.values = 1  # the lower bound so far (module docstring): the larger of
        self.strings, self._separated = 0, 1  # strings, and 1 + commas + colons outside strings
        self._json_bytes = json_bytes
        self._quotes = 0
        self._pending = b""  # a run of backslashes that ended the last chunk
        self._head = b""  # the JSON's first 4 bytes, which tell its encoding (json.detect_encoding)

    @property
    def over(self) -> bool:
        return self.values > self.budget

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
        outside = data if not quotes else b"".join(data.split(b'"')[inside::2])
        if inside and not quotes:
            outside = b""
        self._separated += outside.count(b",") + outside.count(b":")
        self.values = max(self._separated, self.strings)

    def recount(self, body: bytes) -> None:
        """Count the whole body again, in UTF-8, when it is UTF-16 or UTF-32 (the module docstring)."""
        text = body[:self._json_bytes] if self._json_bytes is not None else body
        encoding = json.detect_encoding(text[:4])
        if not encoding.startswith("utf-8"):
            again = ValueCount(self.budget)
            again.feed(text.decode(encoding, "replace").encode())
            self.values, self.strings = again.values, again.strings

    def check(self, what: str, whom: str) -> None:
        """InvalidInput if over the budget: `what` the body is, `whom` the budget is for."""
        if self.over:
            raise InvalidInput(self.refusal(what, whom))

    def refusal(self, what: str, whom: str) -> str:
        """Why a body over the budget is refused: `what` the body is, `whom` the budget is for."""
        return (f"{what} holds at least {self.values} JSON values, more than the {self.budget} a "
                f"request to {whom} can hold; it was refused before it was parsed")


def budget(models, name: str | None = None, task: str | None = None) -> int:
    """ENVELOPE plus the most values a request needs for the served model `name`, else for the
    most generous served model of `task` (any task when None): `models` is a server.models.ModelSet."""
    served = models.models
    chosen = ([served[name]] if name in served else
              [m for m in served.values() if task is None or task_of(m.engine.spec) is task_named(task)])
    return ENVELOPE + max((_needs(m) for m in chosen), default=0)


def _needs(model) -> int:
    """Values a request for `model` (a ServedModel) needs on any route besides the envelope."""
    program, admission = model.engine.spec.program, model.admission
    return task_of(program).json_values(program, admission.max_inflight + admission.max_queue)
