"""Tokenizer fixtures: the converted Qwen vocabulary (from the tiny checkpoint) and tiktoken's."""

import pytest

from boundgen.text import vocab
from boundgen.text.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_qwen3_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_qwen3_dir)


@pytest.fixture(scope="session")
def tiktoken_encoding():
    """The reference: tiktoken over the same qwen.tiktoken ranks, with our added tokens as specials."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    specials = {text: vocab.FIRST_ADDED_ID + i for i, (text, _) in enumerate(vocab.ADDED_TOKENS)}
    ranks = load_tiktoken_bpe(str(vocab.tiktoken_file()))
    return tiktoken.Encoding("qwen", pat_str=vocab.PAT, mergeable_ranks=ranks, special_tokens=specials)
