"""Reading a catalogue's items from JSON lines, every error naming its line.

    ITEMS.jsonl: one object a line, {"item_id": INT, "token_ids": [INT, ...]} or
                 {"item_id": INT, "text": "..."} (blank lines are skipped), either with an
                 optional "subsets": ["NAME", ...] (the named subsets the item belongs to)
    -> item ids [items] int64, codes (token id lists), line numbers [items] int64, subsets
    -> Catalogue.from_sequences (text/catalogue.py), Catalogue.with_subsets

Texts are tokenized with the catalogue's tokenizer (no template, no special tokens), in batches.
Checked, each error naming the line (1-based): UTF-8, JSON, an object with exactly `item_id` and
one of `token_ids` / `text` (and optionally `subsets`, a list of names), item_id an integer in
[0, 2^63), token ids integers in [0, vocab_size), no empty sequence, none longer than
`max_depth`, no item_id twice (both lines named), subset names as text/catalogue.py's
SUBSET_NAME. One sequence for two item_ids is checked on the sorted codes (Catalogue.from_sequences).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from boundgen.errors import ConfigError, InvalidInput, repeated_keys
from boundgen.text.catalogue import Catalogue, check_subset_name, tokenizer_sha256
from boundgen.text.utf8 import utf8

PROGRESS_EVERY = 1_000_000  # lines between progress reports
TEXT_BATCH = 4096  # texts tokenized per call
MAX_ITEM_ID = 2 ** 63 - 1


class ItemsError(ConfigError):
    """A line of an items file that cannot be read as an item."""


def build_catalogue(items_file: str | Path, tokenizer, max_depth: int | None = None,
                    progress: Callable[[str], None] | None = None) -> Catalogue:
    """ITEMS.jsonl + a Tokenizer (text/tokenizer.py) -> the Catalogue (not yet saved)."""
    vocab = tokenizer.vocab_size
    ids, codes, lines = [], [], []
    subsets: dict[str, list[int]] = {}  # name -> its item ids
    texts: list[tuple[int, str]] = []  # (index into codes, text): tokenized in batches

    def tokenize():
        encoded = tokenizer.ids([t for _, t in texts])
        for (at, _), code in zip(texts, encoded):
            _check_code(code, lines[at], vocab, max_depth, from_text=True)
            codes[at] = code
        texts.clear()

    with open(items_file, "rb") as f:
        line_no = 0
        for line_no, raw in enumerate(f, start=1):
            if progress and line_no % PROGRESS_EVERY == 0:
                progress(f"catalogue: {line_no:,} lines read")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ItemsError(f"line {line_no}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            item_id, code, text, names = _parse(line, line_no, vocab, max_depth)
            for name in names:
                subsets.setdefault(name, []).append(item_id)
            lines.append(line_no)
            ids.append(item_id)
            codes.append(code)
            if text is not None:
                texts.append((len(codes) - 1, text))
                if len(texts) >= TEXT_BATCH:
                    tokenize()
    if texts:
        tokenize()
    if not ids:
        raise ItemsError(f"{items_file} holds no items")
    item_ids, line_arr = np.asarray(ids, dtype=np.int64), np.asarray(lines, dtype=np.int64)
    _check_unique_ids(item_ids, line_arr)
    if progress:
        progress(f"catalogue: {len(ids):,} items read; building the trie")
    cat = Catalogue.from_sequences(item_ids, codes, tokenizer_identity(tokenizer), lines=line_arr)
    return cat.with_subsets(subsets) if subsets else cat


def tokenizer_identity(tokenizer) -> dict:
    """What a catalogue records of its tokenizer: vocab size and the sha256 of its tokenizer.json."""
    return {"vocab_size": int(tokenizer.vocab_size), "sha256": tokenizer_sha256(tokenizer.source)}


def _parse(line: str, line_no: int, vocab: int, max_depth: int | None):
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ItemsError(f"line {line_no}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ItemsError(f"line {line_no}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ItemsError(f"line {line_no}: expected a JSON object, got {type(obj).__name__}")
    # A key twice (or its text again as a value), or escapes that may spell a key another way
    # ("item\u005fid"): parse again, keeping every member, to refuse the repeat.
    if "\\u" in line or any(line.count(f'"{key}"') > 1 for key in obj):
        json.loads(line, object_pairs_hook=lambda pairs: _unique(pairs, line_no))
    keys = set(obj)
    extra = sorted(keys - {"item_id", "token_ids", "text", "subsets"})
    if extra:
        raise ItemsError(f"line {line_no}: unknown fields {extra}; an item has item_id and token_ids or text "
                         "(and optionally subsets)")
    if "item_id" not in keys:
        raise ItemsError(f"line {line_no}: no item_id")
    if ("token_ids" in keys) == ("text" in keys):
        raise ItemsError(f"line {line_no}: give exactly one of token_ids and text")
    item_id = obj["item_id"]
    if isinstance(item_id, bool) or not isinstance(item_id, int) or not 0 <= item_id <= MAX_ITEM_ID:
        raise ItemsError(f"line {line_no}: item_id must be an integer in [0, 2^63), got {item_id!r}")
    if "text" in keys:
        text = obj["text"]
        if not isinstance(text, str) or not text:
            raise ItemsError(f"line {line_no}: text must be a non-empty string, got {text!r}")
        try:
            utf8(text, f"line {line_no}: the text")  # \ud800 escaped in the JSON: the tokenizer would read U+FFFD
        except InvalidInput as exc:
            raise ItemsError(str(exc)) from None
        return item_id, None, text, _subsets(obj, line_no)
    code = obj["token_ids"]
    if not isinstance(code, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in code):
        raise ItemsError(f"line {line_no}: token_ids must be a list of integers")
    _check_code(code, line_no, vocab, max_depth, from_text=False)
    return item_id, code, None, _subsets(obj, line_no)


def _unique(pairs: list, line_no: int) -> dict:
    """A JSON object's members, refusing a key given twice (json.loads would keep the last silently)."""
    twice = repeated_keys(pairs)
    if twice:
        raise ItemsError(f"line {line_no}: field {twice[0]!r} is given twice")
    return dict(pairs)


def _subsets(obj: dict, line_no: int) -> list[str]:
    names = obj.get("subsets", [])
    if not isinstance(names, list):
        raise ItemsError(f"line {line_no}: subsets must be a list of names, got {names!r}")
    for name in names:
        try:
            check_subset_name(name)
        except ConfigError as exc:
            raise ItemsError(f"line {line_no}: {exc}") from None
    return names


def _check_code(code: list, line_no: int, vocab: int, max_depth: int | None, from_text: bool):
    what = "the text's tokens" if from_text else "token_ids"
    if not code:
        raise ItemsError(f"line {line_no}: {what} are empty; an item needs at least one token")
    if max_depth is not None and len(code) > max_depth:
        raise ItemsError(f"line {line_no}: {what} are {len(code)} tokens, more than --max-depth {max_depth}")
    low, high = min(code), max(code)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ItemsError(f"line {line_no}: token id {bad} is outside the tokenizer's vocabulary [0, {vocab})")


def _check_unique_ids(item_ids: np.ndarray, lines: np.ndarray) -> None:
    order = np.argsort(item_ids, kind="stable")
    dup = np.flatnonzero(item_ids[order[1:]] == item_ids[order[:-1]])
    if len(dup):
        first, second = order[dup[0]], order[dup[0] + 1]
        raise ItemsError(f"lines {lines[first]} and {lines[second]}: item_id {item_ids[first]} appears twice "
                         f"({len(dup)} repeats in all)")
