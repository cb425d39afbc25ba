"""Packing, checks and label ids of boundgen.text.tokenizer."""

import pytest
import torch

from boundgen.artifact.program import ScoreSpec
from boundgen.errors import ConfigError, InvalidInput
from boundgen.text.template import Template
from boundgen.text.tokenizer import PackedBuffers, Tokenizer

TEXTS = ["Hello world", "中文分词测试 😀", "a", "  leading and trailing  \n", "<|im_start|>user\nHi<|im_end|>"]


def expected_ids(tok, texts):
    return [tok.backend.encode(t, add_special_tokens=False).ids for t in texts]


def check_packed(batch, ids):
    lengths = [len(i) for i in ids]
    assert batch.lengths == lengths
    assert batch.num_samples == len(ids) and batch.num_tokens == sum(lengths)
    assert batch.tokens.dtype == torch.int64 and batch.positions.dtype == torch.int64
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.tokens.tolist() == [t for seq in ids for t in seq]
    assert batch.positions.tolist() == [p for n in lengths for p in range(n)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    assert batch.cu_seqlens.tolist() == cu


def test_encode_packed_layout(qwen_tokenizer):
    batch = qwen_tokenizer.encode_packed(TEXTS, max_tokens_per_sample=64)
    check_packed(batch, expected_ids(qwen_tokenizer, TEXTS))
    assert batch.lengths[0] == 2 and batch.tokens[:2].tolist() == [9707, 1879]
    assert batch.tokens[-1].item() == 151645  # <|im_end|> written in the text is the added token


def test_encode_packed_single_sample_and_many(qwen_tokenizer):
    check_packed(qwen_tokenizer.encode_packed(["x"], 1), [[87]])
    texts = [f"sample number {i}" * (i % 5 + 1) for i in range(37)]
    check_packed(qwen_tokenizer.encode_packed(texts, 64), expected_ids(qwen_tokenizer, texts))


def test_sample_at_the_limit_is_accepted(qwen_tokenizer):
    n = len(expected_ids(qwen_tokenizer, [TEXTS[1]])[0])
    assert qwen_tokenizer.encode_packed([TEXTS[1]], n).lengths == [n]


def test_template_is_applied_and_counted(qwen_tokenizer):
    template = "Query: {text}\nRelevant:"
    batch = qwen_tokenizer.encode_packed(["cats", "dogs"], 16, template=template)
    check_packed(batch, expected_ids(qwen_tokenizer, ["Query: cats\nRelevant:", "Query: dogs\nRelevant:"]))
    with pytest.raises(InvalidInput, match=r"sample 0 has \d+ tokens.*limit of 3 .*template included"):
        qwen_tokenizer.encode_packed(["cats"], 3, template=Template(template))


def test_out_buffers_are_written_and_viewed(qwen_tokenizer):
    out = PackedBuffers.allocate(max_tokens=128, max_samples=8)
    first = qwen_tokenizer.encode_packed(TEXTS, 64, out=out)
    check_packed(first, expected_ids(qwen_tokenizer, TEXTS))
    assert first.tokens.data_ptr() == out.tokens.data_ptr()
    assert first.positions.data_ptr() == out.positions.data_ptr()
    assert first.cu_seqlens.data_ptr() == out.cu_seqlens.data_ptr()
    second = qwen_tokenizer.encode_packed(["Hello world"], 64, out=out)  # reuse: only the valid prefix is written
    check_packed(second, [[9707, 1879]])


def test_out_buffer_capacity_is_checked(qwen_tokenizer):
    out = PackedBuffers.allocate(max_tokens=4, max_samples=2)
    with pytest.raises(InvalidInput, match="3 samples; at most 2"):
        qwen_tokenizer.encode_packed(["a", "b", "c"], 8, out=out)
    with pytest.raises(InvalidInput, match="6 tokens in all; at most 4"):
        qwen_tokenizer.encode_packed(["a b c", "d e f"], 8, out=out)


def test_encode_one(qwen_tokenizer):
    batch = qwen_tokenizer.encode_one("Hello world", max_tokens=8)
    check_packed(batch, [[9707, 1879]])
    with pytest.raises(InvalidInput, match="the prompt has 2 tokens, more than the limit of 1"):
        qwen_tokenizer.encode_one("Hello world", max_tokens=1)
    with pytest.raises(InvalidInput, match="the prompt is empty"):
        qwen_tokenizer.encode_one(" \t", max_tokens=8)


@pytest.mark.parametrize("texts,match", [
    ([], "no samples"),
    (["ok", ""], "sample 1 is empty or whitespace only"),
    (["ok", "fine", " \n\t\u3000"], "sample 2 is empty or whitespace only"),
    (["ok", b"bytes"], "sample 1 must be a string, got bytes"),
    ("a single string", "must be a list of strings"),
])
def test_invalid_samples(qwen_tokenizer, texts, match):
    with pytest.raises(InvalidInput, match=match):
        qwen_tokenizer.encode_packed(texts, 16)


def test_too_long_sample_names_index_count_and_limit(qwen_tokenizer):
    with pytest.raises(InvalidInput, match=r"^sample 2 has 300 tokens, more than the limit of 256 tokens per sample$"):
        qwen_tokenizer.encode_packed(["ok", "fine", " x" * 300], 256)


def test_bad_limit_is_a_config_error(qwen_tokenizer):
    with pytest.raises(ConfigError, match="positive integer"):
        qwen_tokenizer.encode_packed(["ok"], 0)


def test_token_id(qwen_tokenizer):
    assert qwen_tokenizer.token_id(" yes") == 9834
    assert qwen_tokenizer.token_id("<|im_end|>") == 151645
    with pytest.raises(InvalidInput, match=r"label ' yes no' is 2 tokens: ' yes' \(9834\) \+ ' no' \(\d+\)"):
        qwen_tokenizer.token_id(" yes no")
    with pytest.raises(InvalidInput, match="label '' is 0 tokens; a label must be exactly one token"):
        qwen_tokenizer.token_id("")


def test_decode(qwen_tokenizer):
    assert qwen_tokenizer.decode([9707, 1879]) == "Hello world"
    assert qwen_tokenizer.decode(torch.tensor([9707, 151643, 1879])) == "Hello world"
    assert qwen_tokenizer.decode([9707, 151935]) == "Hello"  # model-only ids past the tokenizer decode to nothing
    assert qwen_tokenizer.decode_batch([[9707], [1879], []]) == ["Hello", " world", ""]
    with pytest.raises(InvalidInput, match="non-negative"):
        qwen_tokenizer.decode([9707, -1])


def test_from_dir_without_tokenizer(tmp_path):
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_template_needs_placeholder():
    with pytest.raises(ConfigError, match=r"no \{text\} placeholder"):
        Template("Query: ")
    assert Template('{"q": "{text}"}').render("x") == '{"q": "x"}'  # other braces are literal
    assert Template().is_identity and Template().render("x") == "x"


def test_a_template_that_is_not_utf8_is_refused_where_it_is_given():
    """A command line's bytes that were not UTF-8 (`--template $'\\xff{text}'`): an internal error when the
    first text was encoded, and a build compiled it without a word."""
    with pytest.raises(ConfigError, match="is not valid UTF-8 text: it holds a lone surrogate at character 0"):
        Template("\udcff{text}")
    with pytest.raises(ConfigError, match="is not valid UTF-8 text"):
        ScoreSpec(labels=(" yes",), label_token_ids=(9693,), template="\udcff{text}")
    assert Template("«{text}»").render("x") == "«x»"


def test_texts_encoded_on_threads_get_the_same_ids(tiny_qwen3_dir):
    """serve --tokenize-threads: a request's texts spread over a thread pool encode as one thread does."""
    one, four = Tokenizer.from_dir(tiny_qwen3_dir), Tokenizer.from_dir(tiny_qwen3_dir, threads=4)
    assert four.options["threads"] == 4 and four.threads == 4
    texts = [f"query: {i} running shoes 咖啡 " * (1 + i % 5) for i in range(15)]
    a, b = one.encode_packed(texts, 512), four.encode_packed(texts, 512)
    assert a.lengths == b.lengths and a.tokens.tolist() == b.tokens.tolist()


def test_one_tokenizer_json_is_parsed_once_per_process(tiny_qwen3_dir, tmp_path):
    """Two directories with the same tokenizer.json (a new version of an artifact) share one parsed
    tokenizer: `tokenizers` and the JSON decoder hold the GIL while they parse (~0.7 s each for
    Qwen's vocabulary), which stalled every request of a server during a repository load. Another
    file gets its own."""
    import shutil

    from boundgen.text.tokenizer import Tokenizer

    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(tiny_qwen3_dir / "tokenizer.json", copy / "tokenizer.json")
    first, second = Tokenizer.from_dir(tiny_qwen3_dir), Tokenizer.from_dir(copy, joined=True)
    assert second.backend is first.backend and second.decoder is first.decoder
    other = tmp_path / "other"
    other.mkdir()
    text = (tiny_qwen3_dir / "tokenizer.json").read_text(encoding="utf-8")
    (other / "tokenizer.json").write_text(text.replace('"normalizer"', '"normalizer" ', 1), encoding="utf-8")
    assert Tokenizer.from_dir(other).backend is not first.backend
    assert second.encode_packed(["hello world"], 16).num_tokens == first.encode_packed(["hello world"], 16).num_tokens


def test_a_vocabulary_is_converted_to_bytes_once_a_load(tiny_qwen3_dir, tmp_path, monkeypatch):
    """The fast encoder and the byte decoder share one pass of the vocabulary's tokens to bytes
    (~0.1 s for Qwen's, of a worker's restart); each used to make its own."""
    import json

    from boundgen.text import byte_decoder, fast_bpe
    from boundgen.text.tokenizer import Tokenizer

    calls = []
    convert = fast_bpe.byte_level_bytes
    for module in (fast_bpe, byte_decoder):
        monkeypatch.setattr(module, "byte_level_bytes", lambda token: calls.append(token) or convert(token))
    other = tmp_path / "once"
    other.mkdir()
    text = (tiny_qwen3_dir / "tokenizer.json").read_text(encoding="utf-8")
    (other / "tokenizer.json").write_text(text.replace('"normalizer"', '"normalizer"  ', 1), encoding="utf-8")
    tokenizer = Tokenizer.from_dir(other)  # a content no earlier test loaded: parsed here
    assert tokenizer.fast is not None and tokenizer.decoder is not None
    parsed = json.loads(text)
    assert len(calls) == len(parsed["model"]["vocab"]) + len(parsed["added_tokens"])  # the added tokens: the decoder
