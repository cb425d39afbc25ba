"""The checks of a request's texts that need no tokenizer: each a string with content, and UTF-8.

The tokenizer runs them before it encodes (text/tokenizer.py), and the server before it admits a
request (server/signature.py), so that such a fault is a 400 under any load; this module imports
no torch, as none of the server's modules does (tests/server/test_endpoints.py).
"""

from __future__ import annotations

from typing import Sequence

from boundgen.errors import InvalidInput
from boundgen.text.utf8 import utf8


def check_texts(texts: Sequence, names: Sequence[str]) -> None:
    """Each text a string with content (`names` say which sample in an error)."""
    for name, text in zip(names, texts):
        if not isinstance(text, str):
            raise InvalidInput(f"{name} must be a string, got {type(text).__name__}")
        if not text or text.isspace():  # what `not text.strip()` says, without copying the text
            raise InvalidInput(f"{name} is empty or whitespace only; every text needs content")
        if not text.isascii():  # (a flag of the string: free) only then can it hold a lone surrogate
            utf8(text, name)
