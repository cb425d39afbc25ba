"""A faster encoder for Qwen-style tokenizers: tiktoken over the tokenizer.json's own vocabulary.

Qwen's vocabulary is a byte-level BPE made with tiktoken, and its tokenizer.json says so:
BPE with `ignore_merges` (a pre-token that is itself a token maps straight to its id), an NFC
normalizer, a Split on Qwen2's regex, a ByteLevel pre-tokenizer without its own regex, added
tokens matched on the raw text. tiktoken encodes such a vocabulary ~10x faster than
`tokenizers` (a W1 request of 15 samples, ~2,300 tokens: 0.66 ms against 8.4 ms on a loaded
2-core CPU), which matters because tokenizing is on every request's critical path.

    text -> split on added tokens (leftmost, longest first; matched before normalizing)
         -> each other piece: NFC -> tiktoken's regex split + BPE over the vocabulary's ranks
         -> ids, added tokens' ids in place

Joined (`Tokenizer.from_dir(..., joined=True)`, `boundgen bench --tokenizer fast-joined`), a
request's texts are encoded in one call into tiktoken, joined by a separator it knows as a
special token (tiktoken runs its regex and BPE on each stretch between special tokens, as the
separate calls would). tiktoken lets go of the GIL for each call, and getting it back waits for
whatever Python code another thread runs (up to the 5 ms switch interval): beside a thread
running Python, a W1 request's 15 calls took 80 ms and one call 6 ms (0.50 against 0.55 ms on
an idle 2-core CPU). An engine loads its tokenizer joined (runtime/loading.py: under load the
H200 measured W1's `pre` 2.22 against 3.35 ms at c=6); `Tokenizer.from_dir` itself keeps text by
text unless asked (`boundgen bench --tokenizer fast-text-by-text` for an A/B). A batch whose texts
could encode otherwise joined (one holds the separator, a piece NFC would change, added tokens
of which one starts another) is encoded text by text.

The packed path (`encode_array`, what `Tokenizer.encode_packed` calls) takes the ids as tiktoken
writes them, into one buffer a call that numpy reads (`encode_to_numpy`): no Python int a token,
no list a text. Joined, a request is one call; text by text, one call a text, each returning its
own buffer. Texts that cannot join fall back to `encode_batch`'s lists, copied into one array.

`fast_encoder(tokenizer_json)` returns an encoder only for a tokenizer.json of exactly that
shape, and only if it encodes a probe corpus (added tokens in text, CJK, emoji and ZWJ
sequences, combining marks, whitespace runs, digits, contractions) to the ids `tokenizers`
gives; otherwise None, and the caller keeps `tokenizers`. tests/text/test_fast_bpe.py checks
parity on a larger corpus.
"""

from __future__ import annotations

import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Sequence

import numpy as np

PROBES = (
    "Hello world", "query: running shoes | item: trail running shoe", "  leading and   inner   spaces  ",
    "line\nbreaks\r\n\r\nand\ttabs", "I'm we'll they'd IT'S", "numbers 1234567 and 3.14159",
    "多语言 文本 の テキスト 한국어", "emoji 👍🏽 family 👨‍👩‍👧‍👦 flag 🇩🇪", "combining e\u0301 vs \u00e9, A\u030a",
    "<|im_start|>user\nhi<|im_end|>\n<think></think>", "x<|endoftext|>y<tool_call>z</tool_call>",
    "ﬁ ligature, ｆｕｌｌｗｉｄｔｈ, Å", "\u200b zero width \ufeff bom", "!!!???... ---", "a" * 300,
)


def bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character table of byte-level BPE (GPT-2's)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_TO_BYTE = str.maketrans({c: chr(b) for b, c in bytes_to_unicode().items()})  # alphabet char -> chr(its byte)
_ALPHABET = str.maketrans({c: None for c in bytes_to_unicode().values()})  # deletes the alphabet's chars


def byte_level_bytes(token: str) -> bytes | None:
    """A byte-level BPE token's bytes (each character through bytes_to_unicode's inverse), or None
    if a character is outside that alphabet. Two str.translate calls: a vocabulary of 150k tokens
    in ~0.1 s, where a generator over its characters took ~0.7 s."""
    if token.translate(_ALPHABET):
        return None
    return token.translate(_TO_BYTE).encode("latin-1")


def vocab_bytes(tokenizer_json: dict) -> dict[str, bytes | None]:
    """Each vocabulary token's bytes (byte_level_bytes), computed once a tokenizer.json for both the
    fast encoder and the byte decoder (~0.1 s for Qwen's 150k tokens)."""
    return {token: byte_level_bytes(token) for token in (tokenizer_json.get("model") or {}).get("vocab") or {}}


def _eligible(tokenizer_json: dict) -> str | None:
    """The split regex if the tokenizer.json is of the shape this encoder reproduces, else None."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or not model.get("ignore_merges") or model.get("dropout") \
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("byte_fallback"):
        return None
    normalizer = tokenizer_json.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if (split.get("type") != "Split" or pattern is None or split.get("behavior") != "Isolated" or split.get("invert")
            or byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space")
            or byte_level.get("use_regex")):
        return None
    for added in tokenizer_json.get("added_tokens") or ():
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word") or added.get("normalized"):
            return None
    return pattern


SEPARATOR = "\ue000boundgen\ue001"  # private-use code points around a name: no border, nothing a text holds


class FastEncoder:
    """Texts -> ids as the tokenizer.json's `tokenizers` pipeline gives them (no special tokens added).
    `encoding`: a tiktoken Encoding whose special tokens are the added tokens and, if `separator_id`
    is given, SEPARATOR with that id (encode_batch's one call)."""

    def __init__(self, encoding, added: dict[str, int], nfc: bool, separator_id: int | None = None,
                 joined: bool = True):
        self.encoding, self.added, self.nfc = encoding, added, nfc
        # Longest first: at a position where several added tokens match, the longest wins.
        names = sorted(added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self._first_chars = frozenset(name[0] for name in names)  # a text without these holds no added token
        # tiktoken matches special tokens by an alternation in no fixed order: the joined call
        # agrees with the split above only where no two of them can match at one position.
        specials = [*added, SEPARATOR]
        nested = any(a != b and b.startswith(a) for a in specials for b in specials)
        self.separator_id = None if nested else separator_id
        self._specials = frozenset(specials)  # what tiktoken matches as special tokens in encode_array's calls
        self.joined = joined and self.separator_id is not None  # encode_batch: a batch in one call

    def text_by_text(self) -> "FastEncoder":
        """This encoder with encode_batch (and encode_array) calling tiktoken once a text."""
        return FastEncoder(self.encoding, self.added, self.nfc, separator_id=self.separator_id, joined=False)

    def encode(self, text: str) -> list[int]:
        pieces = self._split.split(text) if self._split else [text]
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:  # the splitting group: an added token
                ids.append(self.added[piece])
            elif piece:
                ids += self.encoding.encode_ordinary(unicodedata.normalize("NFC", piece) if self.nfc else piece)
        return ids

    def encode_batch(self, texts: Sequence[str], threads: int = 1) -> list[list[int]]:
        """Each text's ids. `threads` > 1: texts spread over that many threads of a pool shared by the
        process (tiktoken releases the GIL while it encodes), for a request's latency on idle cores."""
        if threads > 1 and len(texts) >= 2:
            return _spread(self.encode, texts, threads)
        if not self.joined or len(texts) < 2 or not all(self._joinable(t) for t in texts):
            return [self.encode(text) for text in texts]
        ids = self.encoding.encode(SEPARATOR.join(texts), allowed_special="all")
        out, start = [], 0
        for _ in range(len(texts) - 1):
            end = ids.index(self.separator_id, start)
            out.append(ids[start:end])
            start = end + 1
        out.append(ids[start:])
        return out

    def _joinable(self, text: str) -> bool:
        """Whether `text`, joined with others, encodes as it does alone: it does not hold the
        separator and NFC leaves its pieces between added tokens as they are (the joined call
        does not normalize)."""
        if SEPARATOR in text:
            return False
        if not self.nfc:
            return True
        if not any(c in text for c in self._first_chars):  # no added token: one piece (a scan, not the regex)
            return unicodedata.is_normalized("NFC", text)
        pieces = self._split.split(text) if self._split else [text]
        return all(unicodedata.is_normalized("NFC", piece) for piece in pieces[::2])

    def encode_array(self, texts: Sequence[str], threads: int = 1) -> tuple[np.ndarray, list[int]]:
        """The ids `encode_batch` gives, back to back: (tokens [T] int64, each text's count).

        tiktoken writes each call's ids into a buffer numpy reads, so no Python int is made a token.
        Joined, the batch is one call (`threads` > 1: one call a thread, on consecutive texts);
        text by text, one call a text. Texts that `_joinable` refuses (and a nested set of added
        tokens) take `encode_batch`'s lists instead. Each call lets go of the GIL once; getting it
        back may wait behind another thread running Python, so fewer calls keep a loaded server's
        `pre` flat."""
        if not texts:
            return np.empty(0, dtype=np.int64), []
        if self.separator_id is None or not all(self._joinable(t) for t in texts):
            ids = self.encode_batch(texts, threads)
            lengths = [len(i) for i in ids]
            return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=sum(lengths)), lengths
        if not self.joined:
            groups = [[text] for text in texts]
        else:
            per = -(-len(texts) // max(1, min(threads, len(texts))))  # ceil: `threads` groups at most
            groups = [texts[i:i + per] for i in range(0, len(texts), per)]
        if threads > 1 and len(groups) > 1:
            parts = _spread(self._joined_ids, groups, threads)
        else:
            parts = [self._joined_ids(group) for group in groups]
        views = [view for part in parts for view in part]
        tokens = np.concatenate(views, dtype=np.int64) if len(views) > 1 else views[0].astype(np.int64)
        return tokens, [int(view.shape[0]) for view in views]

    def _joined_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`texts` (each `_joinable`) in one tiktoken call: a uint32 view of each text's ids."""
        ids = self.encoding.encode_to_numpy(SEPARATOR.join(texts), allowed_special=self._specials,
                                            disallowed_special=())  # [T + B - 1] uint32
        if len(texts) == 1:
            return [ids]
        cut = np.flatnonzero(ids == self.separator_id)
        if cut.shape[0] != len(texts) - 1:
            raise AssertionError(f"{len(texts)} texts joined gave {cut.shape[0]} separators, not {len(texts) - 1}")
        starts = [0, *(cut + 1).tolist()]
        ends = [*cut.tolist(), int(ids.shape[0])]
        return [ids[a:b] for a, b in zip(starts, ends)]


def _spread(fn, items: Sequence, threads: int) -> list:
    """[fn(item) for item in items], the first on this thread and the rest on the pool of `threads`: the
    caller works instead of waiting, and one thread fewer is woken (a 2-core CPU, 15 texts of ~120 tokens
    joined, 2 ms idle between requests, mean of 2,000: 2 groups 0.49-0.60 ms against 0.64-0.69 with every
    group on the pool, 4 groups 0.57-0.62 against 0.62-0.65; one thread alone 0.39 on that CPU)."""
    pool = _pool(threads)
    rest = [pool.submit(fn, item) for item in items[1:]]
    first = fn(items[0])
    return [first, *(future.result() for future in rest)]


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of `threads` encoding threads (made once, on first use)."""
    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="boundgen-tokenize")
    return _POOLS[threads]


def fast_encoder(tokenizer_json: dict, reference, token_bytes: dict[str, bytes | None] | None = None) -> FastEncoder | None:
    """A FastEncoder for the parsed tokenizer.json if it has the shape above, tiktoken is
    installed and it encodes PROBES exactly as `reference` (the `tokenizers` object) does;
    `token_bytes`: its vocab_bytes, where the caller has them."""
    pattern = _eligible(tokenizer_json)
    if pattern is None:
        return None
    try:
        import tiktoken  # optional: without it the tokenizer is `tokenizers` alone
    except ImportError:
        return None
    token_bytes = vocab_bytes(tokenizer_json) if token_bytes is None else token_bytes
    ranks = {token_bytes[token]: rank for token, rank in tokenizer_json["model"]["vocab"].items()}
    if None in ranks:  # a token outside the byte-level alphabet: not this kind of vocabulary
        return None
    if len(ranks) != len(tokenizer_json["model"]["vocab"]) or sorted(ranks.values()) != list(range(len(ranks))):
        return None  # tiktoken needs ranks 0..n-1, one per byte string
    added = {a["content"]: a["id"] for a in tokenizer_json.get("added_tokens") or ()}
    separator_id = max([len(ranks) - 1, *added.values()]) + 1
    try:
        encoding = tiktoken.Encoding("boundgen", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={**added, SEPARATOR: separator_id})
    except Exception:  # a regex tiktoken's engine does not take: keep `tokenizers`
        return None
    nfc = tokenizer_json.get("normalizer") is not None
    encoder = FastEncoder(encoding, added, nfc=nfc, separator_id=separator_id)
    want = [e.ids for e in reference.encode_batch(list(PROBES), add_special_tokens=False)]
    joinable = [i for i, probe in enumerate(PROBES) if encoder._joinable(probe)]  # the joined call too
    joined = encoder.encode_batch([PROBES[i] for i in joinable])
    same = encoder.encode_batch(PROBES) == want and joined == [want[i] for i in joinable]
    return encoder if same else None
