"""The byte-table decoder gives the texts `tokenizers` gives, on the real Qwen vocabulary: special and
other added tokens with and without skipping, ids past the vocabulary, multi-byte characters split
between ids; and it stands aside for tokenizer.json files of another shape."""

import json
import random

from tokenizers import Tokenizer as HFTokenizer

from boundgen.text.byte_decoder import byte_decoder
from boundgen.text.tokenizer import Tokenizer


def rows(size: int, added: list[int], n: int = 2000, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        row = [rng.randrange(size + 8) for _ in range(rng.randint(0, 16))]  # a few ids past the vocabulary
        for _ in range(rng.randint(0, 2)):
            row.insert(rng.randint(0, len(row)), rng.choice(added))
        out.append(row)
    return out


def test_the_table_decodes_as_tokenizers_does(qwen_tokenizer):
    assert qwen_tokenizer.decoder is not None
    added = list(qwen_tokenizer.backend.get_added_tokens_decoder())
    batch = rows(qwen_tokenizer.vocab_size, added)
    for skip in (True, False):
        assert qwen_tokenizer.decode_rows(batch, skip) == qwen_tokenizer.backend.decode_batch(
            batch, skip_special_tokens=skip)


def test_decode_and_decode_batch_go_through_the_table_with_the_same_result(qwen_tokenizer, tiny_qwen3_dir):
    plain = Tokenizer.from_dir(tiny_qwen3_dir, fast=False)
    assert plain.decoder is None
    text = "多语言 テキスト 👨‍👩‍👧‍👦 <|im_end|> done"
    ids = qwen_tokenizer.encode_one(text, 64).tokens.tolist()
    assert qwen_tokenizer.decode(ids) == plain.decode(ids)
    assert qwen_tokenizer.decode(ids, skip_special_tokens=False) == plain.decode(ids, skip_special_tokens=False)
    assert qwen_tokenizer.decode_batch([ids[:3], ids[3:]]) == plain.decode_batch([ids[:3], ids[3:]])


def _spec(tiny_qwen3_dir) -> dict:
    return json.loads((tiny_qwen3_dir / "tokenizer.json").read_text(encoding="utf-8"))


def test_another_decoder_or_a_disagreeing_reference_keeps_tokenizers(tiny_qwen3_dir):
    spec = _spec(tiny_qwen3_dir)
    reference = HFTokenizer.from_str(json.dumps(spec))
    assert byte_decoder(spec, reference) is not None
    assert byte_decoder({**spec, "decoder": {"type": "Metaspace"}}, reference) is None

    class Disagrees:
        def decode_batch(self, batch, skip_special_tokens=True):
            return ["?" for _ in batch]

    assert byte_decoder(spec, Disagrees()) is None


def test_decode_array_leaves_out_padding_and_stop_ids_as_the_filtered_rows_do(tiny_qwen3_dir):
    """A beam result's id array decodes as its rows without padding (-1) and stop ids, through the
    table and through `tokenizers` alike."""
    import numpy as np

    fast, slow = Tokenizer.from_dir(tiny_qwen3_dir), Tokenizer.from_dir(tiny_qwen3_dir, fast=False)
    assert fast.decoder is not None and slow.decoder is None
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 151_700, size=(64, 5)).astype(np.int32)
    ids[::7, 3:] = -1  # finished beams' padding
    ids[::5, 1] = 151645  # a stop token inside
    stop = (151645, 151643)
    expected = slow.decode_rows([[i for i in row if i >= 0 and i not in stop] for row in ids.tolist()])
    assert fast.decode_array(ids, stop) == expected
    assert slow.decode_array(ids, stop) == expected
    assert fast.decode_array(ids) == slow.decode_rows([[i for i in row if i >= 0] for row in ids.tolist()])
