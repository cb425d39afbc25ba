"""A text as UTF-8, or an error naming where it came from: Python strings may hold lone surrogates
(JSON's \\ud800 escapes, command-line bytes that were not UTF-8), which are no Unicode text and
which the tokenizers read differently (tiktoken as U+FFFD, `tokenizers` not at all)."""

from __future__ import annotations

from boundgen.errors import InvalidInput


def utf8(text: str, where: str) -> bytes:
    """`text` as UTF-8; InvalidInput (400) naming `where` for one that cannot be (a lone surrogate)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{where} is not valid UTF-8 text: it holds a lone surrogate "
                           f"({text[exc.start]!r} at character {exc.start})") from None
