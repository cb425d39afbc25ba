"""The benchmark's named workloads W1, W2, W3 (ARCHITECTURE.md), generated with exact token counts.

A request's texts are made by decoding random token ids drawn from a subset of the vocabulary
that round-trips: ids whose text is a space followed by lowercase ASCII letters and that encode
back to themselves. Each such token is its own pre-token under Qwen's split regex, so a sequence
of them re-encodes to the same number of tokens; every text is still checked with the real
tokenizer (`len(encode(text)) == n`) and resampled if it does not. Same seed, same tokenizer:
same pool of requests, byte for byte.

The tokenizer is boundgen's `Tokenizer` or a `tokenizers.Tokenizer` (see `TokenCodec`). Counts
are of the text itself: an engine template, if one is configured, adds its own tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boundgen.bench.tasks import bench_task

_WORD = re.compile(r" [a-z]{2,12}")


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    task: str  # "score" | "beam"
    preset: str  # demo-model preset with the workload's model shape (see mfu.SHAPES)
    samples: int  # samples per request (beam: 1)
    min_tokens: int  # per-sample token count, uniform in [min_tokens, max_tokens]
    max_tokens: int
    labels: tuple[str, ...] = ()  # score
    width: int = 0  # beam W
    steps: int = 0  # beam N_gen

    def __post_init__(self):
        task = bench_task(self.task)  # ValueError for a task that is none
        if not 0 < self.min_tokens <= self.max_tokens:
            raise ValueError(f"workload token range [{self.min_tokens}, {self.max_tokens}] is empty")
        task.check(self)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


WORKLOADS = {
    "W1": WorkloadSpec("W1", "score", "qwen3-0.6b", samples=15, min_tokens=48, max_tokens=256,
                       labels=(" yes", " no")),
    "W2": WorkloadSpec("W2", "beam", "qwen2.5-0.5b", samples=1, min_tokens=64, max_tokens=64, width=100, steps=5),
    "W3": WorkloadSpec("W3", "beam", "qwen2.5-0.5b", samples=1, min_tokens=400, max_tokens=400, width=100, steps=5),
}


@dataclass(frozen=True)
class Request:
    index: int
    texts: tuple[str, ...]  # score: the samples; beam: the one prompt
    token_counts: tuple[int, ...]  # exact token count of each text under the workload's tokenizer

    @property
    def samples(self) -> int:
        return len(self.texts)

    @property
    def tokens(self) -> int:
        return sum(self.token_counts)


def get_workload(name: str) -> WorkloadSpec:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


class TokenCodec:
    """encode -> list[int] and decode over boundgen's `Tokenizer` (through its `backend`, as its
    packer encodes: no special tokens added) or a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer):
        self.backend = getattr(tokenizer, "backend", tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.backend.decode([int(t) for t in ids])


def load_tokenizer(model_dir: str | Path):
    """boundgen's tokenizer for a checkpoint or artifact dir; `tokenizers` on its tokenizer.json if
    boundgen's own is not importable."""
    try:
        from boundgen.text.tokenizer import Tokenizer
    except ModuleNotFoundError as exc:
        if exc.name != "boundgen.text.tokenizer":
            raise
    else:
        return Tokenizer.from_dir(model_dir)
    from tokenizers import Tokenizer as HFTokenizer

    for path in (Path(model_dir) / "tokenizer.json", Path(model_dir) / "tokenizer" / "tokenizer.json"):
        if path.is_file():
            return HFTokenizer.from_file(str(path))
    raise FileNotFoundError(f"no tokenizer.json in {model_dir} (nor in its tokenizer/ folder)")


def word_vocabulary(codec: TokenCodec, size: int = 4096, id_limit: int = 151643) -> np.ndarray:
    """The first `size` ids (ascending) whose text is ' ' + 2-12 lowercase letters and that
    encode back to exactly themselves."""
    out = []
    for tid in range(id_limit):
        text = codec.decode([tid])
        if _WORD.fullmatch(text) and codec.encode(text) == [tid]:
            out.append(tid)
            if len(out) == size:
                break
    if len(out) < 64:
        raise ValueError(f"tokenizer has only {len(out)} round-tripping word tokens; is it a Qwen vocabulary?")
    return np.asarray(out, dtype=np.int64)


def exact_text(codec: TokenCodec, vocab: np.ndarray, n: int, rng: np.random.Generator, attempts: int = 20) -> str:
    """A text of exactly n tokens: decoded random word tokens, resampled until it re-encodes to n."""
    for _ in range(attempts):
        text = codec.decode(rng.choice(vocab, size=n))
        if len(codec.encode(text)) == n:
            return text
    raise RuntimeError(f"could not make a text of exactly {n} tokens in {attempts} attempts")


def make_requests(spec: WorkloadSpec, tokenizer, count: int, seed: int = 0, vocab: np.ndarray | None = None
                  ) -> list[Request]:
    """`count` distinct requests of workload `spec`, a pure function of (spec, tokenizer, count, seed)."""
    if count <= 0:
        raise ValueError(f"request pool size must be positive, got {count}")
    codec = TokenCodec(tokenizer)
    vocab = word_vocabulary(codec) if vocab is None else vocab
    rng = np.random.default_rng([seed, int(spec.name.lstrip("W") or 0)])
    requests, seen = [], set()
    while len(requests) < count:
        lengths = rng.integers(spec.min_tokens, spec.max_tokens + 1, size=spec.samples)
        texts = tuple(exact_text(codec, vocab, int(n), rng) for n in lengths)
        if texts in seen:
            continue
        seen.add(texts)
        requests.append(Request(len(requests), texts, tuple(int(n) for n in lengths)))
    return requests
