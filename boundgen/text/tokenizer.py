"""Text <-> token ids, straight into the packed layout the model consumes.

A request's samples are checked (non-empty, within the per-sample token bound: never truncated),
templated, encoded in one `encode_batch` call, and written back to back:

    tokens     [T]    int64   sample 0's ids, then sample 1's, ...   T = sum(lengths)
    positions  [T]    int64   0..L_i-1 within each sample
    cu_seqlens [B+1]  int32   0, L_0, L_0+L_1, ..., T

With `out=PackedBuffers` (allocated once per request context, pinned if wanted) the ids are
copied into those buffers and the batch holds views of their first T / B+1 entries.

Added tokens written in the text (e.g. "<|im_end|>") encode to their ids, as with HF's
Qwen tokenizer; no BOS/EOS is added. Where the tokenizer.json is a Qwen-style byte-level BPE,
ids come from tiktoken over the same vocabulary (text/fast_bpe.py: ~10x faster, checked equal
to `tokenizers` at load) and texts from a table of each id's bytes (text/byte_decoder.py: ~3x
faster, checked likewise); `fast=False`, or any other tokenizer.json, uses `tokenizers` itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from boundgen.errors import ConfigError, InvalidInput
from boundgen.text.byte_decoder import ByteDecoder, byte_decoder
from boundgen.text.checks import check_texts
from boundgen.text.fast_bpe import FastEncoder, fast_encoder, vocab_bytes
from boundgen.text.template import Template
from boundgen.text.utf8 import utf8

# Characters: a longer text goes to `tokenizers`. tiktoken's regex backtracks over a run of whitespace
# before a letter and gives up at a million characters; no text the token bounds admit is this long.
FAST_MAX_CHARS = 1 << 18


@dataclass
class PackedBatch:
    tokens: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [B+1] int32
    lengths: list[int]  # [B] tokens per sample

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class PackedBuffers:
    """Preallocated CPU buffers for `encode_packed(out=...)`: capacity max_tokens / max_samples."""
    tokens: torch.Tensor  # [T_max] int64
    positions: torch.Tensor  # [T_max] int64
    cu_seqlens: torch.Tensor  # [B_max+1] int32

    @classmethod
    def allocate(cls, max_tokens: int, max_samples: int, pin_memory: bool = False) -> "PackedBuffers":
        def empty(n, dtype):
            return torch.empty(n, dtype=dtype, pin_memory=pin_memory)
        return cls(empty(max_tokens, torch.int64), empty(max_tokens, torch.int64), empty(max_samples + 1, torch.int32))

    @property
    def max_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_samples(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1


# By the sha256 of tokenizer.json: its `tokenizers` object (shared by the engines that load it,
# never changed after loading) and its FastEncoder and ByteDecoder (each None where it has none).
_BACKENDS: dict[str, HFTokenizer] = {}
_FAST_PATHS: dict[str, tuple[FastEncoder | None, ByteDecoder | None]] = {}


class Tokenizer:
    """HF `tokenizers` pipeline loaded from a tokenizer.json (encoding through `fast` and decoding through
    `decoder` where it has them)."""

    def __init__(self, backend: HFTokenizer, fast: FastEncoder | None = None, decoder: ByteDecoder | None = None):
        self.backend, self.fast, self.decoder = backend, fast, decoder
        self.source: Path | None = None  # the directory its tokenizer.json came from (from_dir)
        self.options: dict = {}  # from_dir's keywords: another process loads the same tokenizer with them
        self.threads = 1  # threads a request's texts are encoded on (the fast encoder only)

    @classmethod
    def from_dir(cls, path: str | Path, fast: bool = True, joined: bool = False, threads: int = 1) -> "Tokenizer":
        """Load `tokenizer.json` from a model or artifact directory; `fast`: encode with tiktoken and
        decode from a byte table where the file allows it (text/fast_bpe.py, text/byte_decoder.py);
        `joined`: a request's texts in one tiktoken call (same ids; engines load it so, runtime/loading.py);
        `threads` > 1: a request's texts encoded on that many threads (joined: one call a thread)."""
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"{path} has no tokenizer.json")
        data = file.read_bytes()
        # One tokenizer.json (by content: a new version of an artifact usually has the same) is
        # parsed once per process. `tokenizers` and the JSON decoder hold the GIL while they parse
        # (~0.7 s each for Qwen's): a repository load stalled every request of the server that long.
        key = hashlib.sha256(data).hexdigest()
        if key not in _BACKENDS:
            try:
                _BACKENDS[key] = HFTokenizer.from_str(data.decode("utf-8"))
            except Exception as exc:
                raise ConfigError(f"{file} is not a valid tokenizers file: {exc}") from None
        backend = _BACKENDS[key]
        if not fast:
            return cls._from(path, {"fast": False, "joined": joined, "threads": threads}, backend)
        if key not in _FAST_PATHS:
            tokenizer_json = json.loads(data)
            token_bytes = vocab_bytes(tokenizer_json)  # one pass over the vocabulary for both
            _FAST_PATHS[key] = (fast_encoder(tokenizer_json, backend, token_bytes),
                                byte_decoder(tokenizer_json, backend, token_bytes))
        encoder, decoder = _FAST_PATHS[key]
        tokenizer = cls._from(path, {"fast": True, "joined": joined, "threads": threads}, backend,
                              encoder if joined or encoder is None else encoder.text_by_text(), decoder)
        tokenizer.threads = threads
        return tokenizer

    @classmethod
    def _from(cls, path, options: dict, *parts) -> "Tokenizer":
        tokenizer = cls(*parts)
        tokenizer.source, tokenizer.options = Path(path).resolve(), options
        return tokenizer

    @property
    def encoder_name(self) -> str:
        """What encodes: "tiktoken" (the fast path; "tiktoken, joined": a request's texts in one
        call) or "tokenizers"."""
        if self.fast is None:
            return "tokenizers"
        return "tiktoken, joined" if self.fast.joined else "tiktoken"

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included (the model's embedding may have more rows)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    # ---- encoding -------------------------------------------------------------------------

    def encode_packed(self, texts: Sequence[str], max_tokens_per_sample: int, template: str | Template = "{text}",
                      out: PackedBuffers | None = None) -> PackedBatch:
        """Validate, template and encode B samples into one packed batch."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInput(f"texts must be a list of strings, got {type(texts).__name__}")
        if not texts:
            raise InvalidInput("no samples: a request needs at least one text")
        names = [f"sample {i}" for i in range(len(texts))]
        return self._encode(texts, max_tokens_per_sample, template, out, names)

    def encode_one(self, text: str, max_tokens: int, template: str | Template = "{text}",
                   out: PackedBuffers | None = None) -> PackedBatch:
        """One prompt (beam search) as a packed batch of B=1, with the same checks."""
        return self._encode([text], max_tokens, template, out, names=["the prompt"])

    def _encode(self, texts, max_tokens, template, out, names) -> PackedBatch:
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigError(f"max tokens per sample must be a positive integer, got {max_tokens!r}")
        template = template if isinstance(template, Template) else Template(template)
        self.check_texts(texts, names)
        if out is not None and len(texts) > out.max_samples:
            raise InvalidInput(f"request has {len(texts)} samples; at most {out.max_samples} are accepted")
        rendered = texts if template.is_identity else [template.render(t) for t in texts]
        tokens, lengths = self.token_array(list(rendered))
        if max(lengths) > max_tokens:
            i = next(i for i, n in enumerate(lengths) if n > max_tokens)
            raise InvalidInput(f"{names[i]} has {lengths[i]} tokens, more than the limit of {max_tokens} tokens per "
                               "sample" + ("" if template.is_identity else " (template included)"))
        total = int(tokens.shape[0])
        if out is not None and total > out.max_tokens:
            raise InvalidInput(f"request has {total} tokens in all; at most {out.max_tokens} are accepted")
        return pack_arrays(tokens, lengths, out)

    check_texts = staticmethod(check_texts)  # each text a string with content (text/checks.py)

    def token_array(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """Texts' ids back to back and each text's count: (tokens [T] int64, lengths [B]); no
        template, no bound. The fast encoder writes them straight into an array (one tiktoken call
        a request where it joins); otherwise each text's id list is copied in (`reference_token_array`)."""
        if self._fast_for(texts):
            return self.fast.encode_array(texts, self.threads)
        return self.reference_token_array(texts)

    def reference_token_array(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """`token_array` through each text's id list (`ids`): the path the array path is tested against."""
        ids = self._ids(texts)
        lengths = [len(i) for i in ids]
        return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=sum(lengths)), lengths

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids as they are: no template, no bound, no special tokens added."""
        return self._ids(list(texts))

    def pack_ids(self, samples: Sequence[Sequence[int]], max_tokens: int, max_total: int) -> PackedBatch:
        """Samples given as token ids -> one packed batch, each id checked against the vocabulary
        (an id the embedding does not have must never reach the device)."""
        vocab, lengths = self.vocab_size, []
        for i, ids in enumerate(samples):
            if isinstance(ids, np.ndarray):
                ids = ids.tolist()
            if (not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)) or not ids
                    or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids)):
                raise InvalidInput(f"sample {i} must be a non-empty list of token ids")
            if len(ids) > max_tokens:
                raise InvalidInput(f"sample {i} has {len(ids)} tokens, more than the limit of {max_tokens} tokens "
                                   "per sample")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidInput(f"sample {i} has token id {bad[0]}, outside this model's vocabulary (0 to {vocab - 1})")
            lengths.append(len(ids))
        total = sum(lengths)
        if total > max_total:
            raise InvalidInput(f"the request has {total} tokens in all; this model accepts at most {max_total}")
        return pack_arrays(np.fromiter(chain.from_iterable(samples), dtype=np.int64, count=total), lengths)

    def _ids(self, texts: list[str]) -> list[list[int]]:
        if self._fast_for(texts):
            return self.fast.encode_batch(texts, self.threads)
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def _fast_for(self, texts: list[str]) -> bool:
        """Whether the fast encoder takes these texts: not past FAST_MAX_CHARS, where tiktoken's regex
        can give up (a million spaces and a letter: a ValueError, or a Rust panic) and `tokenizers` does not."""
        return self.fast is not None and all(len(t) <= FAST_MAX_CHARS for t in texts)

    def token_id(self, text: str) -> int:
        """The id of a label that must be exactly one token, e.g. " yes"."""
        if not isinstance(text, str):
            raise InvalidInput(f"a label is text, got {text!r}")
        utf8(text, f"label {text!r}")  # a command line's bytes that were not UTF-8
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            pieces = " + ".join(f"{self.decode([i], skip_special_tokens=False)!r} ({i})" for i in ids)
            raise InvalidInput(f"label {text!r} is {len(ids)} tokens" + (f": {pieces}" if ids else "")
                               + "; a label must be exactly one token (mind the leading space, e.g. ' yes')")
        return ids[0]

    def label_token_ids(self, labels) -> tuple[int, ...]:
        """The ids of labels that must each be exactly one token."""
        return tuple(self.token_id(label) for label in labels)

    # ---- decoding -------------------------------------------------------------------------

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """ids (list, tensor or array) -> text. Ids past the tokenizer's vocabulary decode to nothing."""
        return self.decode_rows([_id_list(ids)], skip_special_tokens)[0]

    def decode_batch(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return self.decode_rows([_id_list(ids) for ids in batch], skip_special_tokens)

    def decode_array(self, ids: np.ndarray, drop: Sequence[int] = (), skip_special_tokens: bool = True) -> list[str]:
        """A [rows, n] id array -> one text a row, without negative ids (padding) and the ids in `drop`
        (a beam's stop tokens): what a beam result's candidates read as."""
        if self.decoder is not None:
            return self.decoder.decode_array(ids, np.asarray(sorted(drop), dtype=ids.dtype), skip_special_tokens)
        dropped = frozenset(int(i) for i in drop)
        return self.decode_rows([[i for i in row if i >= 0 and i not in dropped] for row in ids.tolist()],
                                skip_special_tokens)

    def decode_rows(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Lists of non-negative Python ints (not checked: `decode_batch` checks) -> texts."""
        if self.decoder is not None:
            return self.decoder.decode_batch(rows, skip_special_tokens)
        return self.backend.decode_batch(rows, skip_special_tokens=skip_special_tokens)


def pack_arrays(tokens: np.ndarray, lengths: list[int], out: PackedBuffers | None = None) -> PackedBatch:
    """Samples' token ids, back to back ([T] int64), with their positions and cu_seqlens (into `out` if given)."""
    total = int(tokens.shape[0])
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    positions = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lengths)
    if out is None:
        return PackedBatch(torch.from_numpy(tokens), torch.from_numpy(positions), torch.from_numpy(cu), lengths)
    batch = PackedBatch(out.tokens[:total], out.positions[:total], out.cu_seqlens[: len(lengths) + 1], lengths)
    batch.tokens.copy_(torch.from_numpy(tokens))
    batch.positions.copy_(torch.from_numpy(positions))
    batch.cu_seqlens.copy_(torch.from_numpy(cu))
    return batch


def _id_list(ids) -> list[int]:
    ids = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
    if ids and min(ids) < 0:
        raise InvalidInput(f"token ids must be non-negative, got {min(ids)} (strip padding before decoding)")
    return ids
