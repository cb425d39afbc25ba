"""The tiktoken fast path gives the ids `tokenizers` gives, on the real Qwen vocabulary, for a corpus
meant to break it: added and special tokens written in text, CJK, emoji and ZWJ sequences,
combining marks, whitespace runs, digits, contractions, random unicode; and it stands aside
for tokenizer.json files of another shape."""

import json
import random

import pytest

from boundgen.text.fast_bpe import PROBES, fast_encoder
from boundgen.text.tokenizer import Tokenizer
from boundgen.text.vocab import ADDED_TOKENS

pytest.importorskip("tiktoken")

PIECES = ["hello", " world", "多语言", "テキスト", "한국어", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "e\u0301", "\u00e9", "A\u030a",
          "Å", "ﬁ", "ｆｕｌｌ", "\u200b", "\ufeff", "  ", "\n", "\r\n", "\t", "   \n  ", "'s", "'LL", "I'm", "123", "4.5",
          "!!!", "?", "...", "-", "_", "<", ">", "|", "<|", "|>", "<|im_start", "im_end|>"] + [t for t, _ in ADDED_TOKENS]


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = list(PROBES)
    for _ in range(n):
        texts.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))))
    for _ in range(n // 4):  # random code points of every plane we may meet (no surrogates)
        texts.append("".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                                 rng.randint(0x3000, 0x9fff), rng.randint(0xac00, 0xd7a3),
                                                 rng.randint(0x1f300, 0x1faff)])) for _ in range(rng.randint(1, 40))))
    return texts


@pytest.fixture(scope="module")
def tokenizers(tiny_qwen3_dir):
    return Tokenizer.from_dir(tiny_qwen3_dir), Tokenizer.from_dir(tiny_qwen3_dir, fast=False)


@pytest.fixture(scope="module")
def joined(tiny_qwen3_dir):
    return Tokenizer.from_dir(tiny_qwen3_dir, joined=True).fast


def test_fast_path_is_taken_for_the_qwen_vocabulary(tokenizers, tiny_qwen3_dir):
    fast, slow = tokenizers
    assert fast.encoder_name == "tiktoken" and slow.encoder_name == "tokenizers"
    assert Tokenizer.from_dir(tiny_qwen3_dir, joined=True).encoder_name == "tiktoken, joined"


def test_same_ids_as_tokenizers(tokenizers):
    fast, slow = tokenizers
    texts = corpus()
    want = [e.ids for e in slow.backend.encode_batch(texts, add_special_tokens=False)]
    got = fast.fast.encode_batch(texts)
    mismatches = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not mismatches, mismatches[:3]


def test_same_packed_batch_and_errors(tokenizers):
    fast, slow = tokenizers
    texts = ["query: shoes <|im_end|>", "多语言 👍🏽", "x" * 50]
    a, b = fast.encode_packed(texts, 64), slow.encode_packed(texts, 64)
    assert a.tokens.tolist() == b.tokens.tolist() and a.cu_seqlens.tolist() == b.cu_seqlens.tolist()
    for tok in tokenizers:
        with pytest.raises(Exception, match="more than the limit of 3 tokens"):
            tok.encode_packed(["one two three four five"], 3)


def test_other_tokenizer_shapes_keep_tokenizers(tiny_qwen3_dir):
    spec = json.loads((tiny_qwen3_dir / "tokenizer.json").read_text())
    reference = Tokenizer.from_dir(tiny_qwen3_dir, fast=False).backend
    for change in (lambda s: s.update(normalizer={"type": "NFKC"}),
                   lambda s: s["model"].update(ignore_merges=False),
                   lambda s: s["added_tokens"][0].update(lstrip=True),
                   lambda s: s["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True)):
        changed = json.loads(json.dumps(spec))
        change(changed)
        assert fast_encoder(changed, reference) is None
    # A vocabulary whose ranks would encode differently fails the probe check.
    swapped = json.loads(json.dumps(spec))
    vocab = swapped["model"]["vocab"]
    vocab["Ġworld"], vocab["Ġthe"] = vocab["Ġthe"], vocab["Ġworld"]
    assert fast_encoder(swapped, reference) is None


class _CountingEncoding:
    """The tiktoken Encoding, counting the calls into it."""

    def __init__(self, encoding):
        self.encoding, self.calls = encoding, 0

    def encode(self, *args, **kwargs):
        self.calls += 1
        return self.encoding.encode(*args, **kwargs)

    def encode_ordinary(self, text):
        self.calls += 1
        return self.encoding.encode_ordinary(text)

    def encode_to_numpy(self, *args, **kwargs):
        self.calls += 1
        return self.encoding.encode_to_numpy(*args, **kwargs)


def test_a_batch_is_one_call_with_the_ids_of_text_by_text(tokenizers, joined, monkeypatch):
    """Texts joined by the separator encode in one call to the ids `tokenizers` gives each alone,
    added tokens written in text and whitespace at either end included."""
    _, slow = tokenizers
    encoder = joined
    counting = _CountingEncoding(encoder.encoding)
    monkeypatch.setattr(encoder, "encoding", counting)
    edges = ["  trailing  ", "\n", "x<|im_end|>", "<|im_start|>", "<|im_end|>\u0338 composes only across the token"]
    texts = [t for t in corpus(seed=1) if encoder._joinable(t)] + edges
    assert len(texts) > 300
    for start in range(0, len(texts), 15):
        batch = texts[start:start + 15]
        counting.calls = 0
        got = encoder.encode_batch(batch)
        assert counting.calls == (1 if len(batch) > 1 else len(batch)), batch
        want = [e.ids for e in slow.backend.encode_batch(batch, add_special_tokens=False)]
        assert got == want, [(t, g, w) for t, g, w in zip(batch, got, want) if g != w][:2]


def test_texts_that_would_join_otherwise_are_encoded_one_by_one(tokenizers, joined, monkeypatch):
    from boundgen.text.fast_bpe import SEPARATOR, FastEncoder
    _, slow = tokenizers
    encoder = joined
    for odd in (f"a{SEPARATOR}b", "<|im_end|> e\u0301 is not NFC", "e\u0301"):
        batch = ["plain text", odd, "more text"]
        assert not encoder._joinable(odd)
        counting = _CountingEncoding(encoder.encoding)
        monkeypatch.setattr(encoder, "encoding", counting)
        got = encoder.encode_batch(batch)
        assert counting.calls >= len(batch)
        assert got[0] == slow.backend.encode("plain text", add_special_tokens=False).ids
        assert got[1] == encoder.encode(odd)
    # Added tokens of which one starts another: tiktoken's alternation could pick either.
    nested = FastEncoder(encoder.encoding, {"<a>": 1, "<a>b": 2}, nfc=False, separator_id=3)
    assert nested.separator_id is None


@pytest.mark.parametrize("joined_mode", [False, True])
@pytest.mark.parametrize("threads", [1, 3])
def test_token_arrays_equal_the_reference_lists_and_tokenizers(tiny_qwen3_dir, tokenizers, joined_mode, threads):
    """The array path (one tiktoken call a request, or a text, or a thread; ids read from tiktoken's
    buffer) gives the ids of each text's id list and of `tokenizers`, for batches of 1 to 15 texts
    mixing texts that join with texts that do not."""
    _, slow = tokenizers
    fast = Tokenizer.from_dir(tiny_qwen3_dir, joined=joined_mode, threads=threads)
    texts = corpus(seed=2) + ["  trailing  ", "\n", "x<|im_end|>", "<|im_start|>", "e\u0301", "<|im_end|>\u0338"]
    rng = random.Random(threads)
    start, batches = 0, []
    while start < len(texts):
        n = rng.randint(1, 15)
        batches.append(texts[start:start + n])
        start += n
    for batch in batches:
        tokens, lengths = fast.token_array(batch)
        ref_tokens, ref_lengths = fast.reference_token_array(batch)
        want = [e.ids for e in slow.backend.encode_batch(batch, add_special_tokens=False)]
        assert tokens.dtype == ref_tokens.dtype and lengths == ref_lengths == [len(w) for w in want], batch
        assert tokens.tolist() == ref_tokens.tolist() == [t for w in want for t in w], batch
    tokens, lengths = fast.token_array([])
    assert tokens.shape == (0,) and lengths == []


def test_a_joinable_request_is_one_call_into_an_array(tokenizers, joined, monkeypatch):
    """Joined: a request of joinable texts costs one tiktoken call (and so one wait for the GIL);
    text by text, one call a text; never a list of Python ints."""
    _, slow = tokenizers
    texts = ["query: running shoes", " trail running shoe <|im_end|>", "多语言 👍🏽", "  spaces  "]
    for encoder, calls in ((joined, 1), (joined.text_by_text(), len(texts))):
        counting = _CountingEncoding(encoder.encoding)
        monkeypatch.setattr(encoder, "encoding", counting)
        tokens, lengths = encoder.encode_array(texts)
        assert counting.calls == calls
        want = [e.ids for e in slow.backend.encode_batch(texts, add_special_tokens=False)]
        assert lengths == [len(w) for w in want] and tokens.tolist() == [t for w in want for t in w]


def test_byte_level_bytes_equals_the_alphabet_table_character_by_character():
    """The translate-based conversion against the table, on random strings over the alphabet and
    characters outside it (space, NUL, é, 中): None exactly where a character is outside."""
    import random

    from boundgen.text.fast_bpe import byte_level_bytes, bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}

    def reference(token):
        try:
            return bytes(to_byte[c] for c in token)
        except KeyError:
            return None

    rng = random.Random(0)
    alphabet = [*to_byte, " ", "\x00", "é", "中", "\u0100"]
    for _ in range(20_000):
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert byte_level_bytes(token) == reference(token), token
    assert byte_level_bytes("") == b""
