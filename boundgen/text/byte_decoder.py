"""A faster decoder for byte-level BPE tokenizers: each id's bytes from a table, joined, UTF-8.

A beam request returns W candidates of up to N_gen tokens each, decoded to text on the caller's
thread while the next call waits for its clients (runtime/requests.py BeamResultBuilder): `tokenizers`'
`decode_batch` took ~130 us for 100 x 5 ids on a 2-core CPU, this table ~45 us.

    ids -> [bytes of each id] -> joined -> .decode("utf-8", "replace")

What `tokenizers` does for a tokenizer.json whose decoder is ByteLevel: ids past the vocabulary
and, with skip_special_tokens, special added tokens decode to nothing; a vocabulary token's
characters map back to bytes through byte-level BPE's byte <-> character table; an added token
with a character outside that table contributes its UTF-8 text. Invalid UTF-8 (a character
split between candidates' last tokens) becomes U+FFFD as Rust's `from_utf8_lossy` makes it
(one per maximal invalid subsequence, as Python's "replace" does).

`byte_decoder(tokenizer_json, reference)` returns a decoder only for a tokenizer.json of that shape,
and only if it decodes a probe set (every added token, alone and between others; seeded random rows,
which split multi-byte characters) as `reference` (the `tokenizers` object) does, with and
without skip_special_tokens; otherwise None and the caller keeps `tokenizers`.
tests/text/test_byte_decoder.py checks parity on more rows.
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from boundgen.text.fast_bpe import byte_level_bytes, vocab_bytes

PROBE_ROWS = 200  # seeded random rows of 1-12 ids, besides the added tokens


class ByteDecoder:
    def __init__(self, kept: list[bytes], skipped: list[bytes]):
        """kept / skipped: each id's bytes, special added tokens as their text / as nothing."""
        self._tables = {False: kept, True: skipped}
        self._padded = {skip: [*table, b""] for skip, table in self._tables.items()}  # id len(table): nothing

    def decode_array(self, ids: np.ndarray, drop: np.ndarray, skip_special_tokens: bool = True) -> list[str]:
        """A [rows, n] id array -> one text a row, leaving out negative ids (padding), the ids in
        `drop` (stop tokens) and ids past the vocabulary: the filtering in numpy, one join a row."""
        table = self._padded[skip_special_tokens]
        nothing = len(table) - 1
        keep = (ids >= 0) & (ids < nothing)
        if drop.size:
            keep &= ~np.isin(ids, drop)
        get = table.__getitem__
        return [b"".join(map(get, row)).decode("utf-8", "replace") for row in np.where(keep, ids, nothing).tolist()]

    def decode_batch(self, rows: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Rows of non-negative ids -> texts, as `tokenizers`' decode_batch."""
        table = self._tables[skip_special_tokens]
        size = len(table)
        if any(max(row, default=0) >= size for row in rows):  # ids past the vocabulary: nothing
            return [b"".join(table[i] for i in row if i < size).decode("utf-8", "replace") for row in rows]
        get = table.__getitem__
        return [b"".join(map(get, row)).decode("utf-8", "replace") for row in rows]


def byte_decoder(tokenizer_json: dict, reference, token_bytes: dict[str, bytes | None] | None = None) -> ByteDecoder | None:
    """A ByteDecoder for the parsed tokenizer.json if its decoder is ByteLevel and it decodes the probes
    exactly as `reference` does; `token_bytes`: the vocabulary's vocab_bytes, where the caller has them."""
    decoder, model = tokenizer_json.get("decoder") or {}, tokenizer_json.get("model") or {}
    if decoder.get("type") != "ByteLevel" or model.get("type") != "BPE":
        return None
    vocab = tokenizer_json["model"].get("vocab") or {}
    added = tokenizer_json.get("added_tokens") or ()
    size = max([*vocab.values(), *(a["id"] for a in added)], default=-1) + 1
    token_bytes = vocab_bytes(tokenizer_json) if token_bytes is None else token_bytes
    kept = [b""] * size
    for token, i in vocab.items():
        kept[i] = _token_bytes(token, token_bytes[token])
    skipped = list(kept)
    for a in added:
        kept[a["id"]] = skipped[a["id"]] = _token_bytes(a["content"], byte_level_bytes(a["content"]))
        if a.get("special"):
            skipped[a["id"]] = b""
    decoder = ByteDecoder(kept, skipped)
    rows = _probe_rows(size, [a["id"] for a in added])
    for skip in (True, False):
        if decoder.decode_batch(rows, skip) != reference.decode_batch(rows, skip_special_tokens=skip):
            return None
    return decoder


def _token_bytes(token: str, data: bytes | None) -> bytes:
    """A token's bytes: `data`, its byte_level_bytes, or its UTF-8 text where a character is outside
    the byte-level table (`data` None)."""
    return token.encode("utf-8") if data is None else data


def _probe_rows(size: int, added_ids: list[int]) -> list[list[int]]:
    rng = random.Random(0)
    rows = [[i] for i in added_ids]
    rows += [[rng.randrange(size), i, rng.randrange(size)] for i in added_ids]
    rows += [[rng.randrange(size) for _ in range(rng.randint(1, 12))] for _ in range(PROBE_ROWS)]
    return rows + [[]]
