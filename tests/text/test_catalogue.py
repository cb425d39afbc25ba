"""Catalogues: the trie against a plain walk over the items, the files, allow-lists, and every bad
input of ITEMS.jsonl named by its line."""

import json
import os
import random

import numpy as np
import pytest

from boundgen.cli.main import main
from boundgen.errors import ConfigError
from boundgen.text.catalogue import Catalogue, check_tokenizer
from boundgen.text.catalogue_items import build_catalogue


class FakeTokenizer:
    """Enough of text/tokenizer.py's Tokenizer for token_ids items: a vocabulary size."""

    vocab_size = 100
    source = None

    def ids(self, texts):
        return [[ord(c) % 100 for c in t] for t in texts]


def prefixes(codes):
    out = {}
    for code in codes:
        for d in range(len(code)):
            out.setdefault(tuple(code[:d]), set()).add(code[d])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trie_matches_a_plain_walk(seed):
    rng = random.Random(seed)
    codes = {tuple(rng.randrange(6) for _ in range(rng.randint(1, 4))) for _ in range(200)}
    codes = [list(c) for c in codes]
    rng.shuffle(codes)
    ids = rng.sample(range(10_000), len(codes))
    cat = Catalogue.from_sequences(ids, codes)
    assert cat.num_items == len(codes) and cat.depth == max(map(len, codes))
    for code, item in zip(codes, ids):
        assert cat.node_item[cat.lookup(code)] == item
    for prefix, tokens in prefixes(codes).items():
        node = cat.lookup(prefix)
        assert node >= 0 and cat.allowed(node) == sorted(tokens)
    assert cat.lookup([7]) == -1
    # Levels: every node of depth d is reached by a code of d tokens.
    depth = np.zeros(cat.num_nodes, dtype=int)
    parent = cat.parent()
    for n in range(1, cat.num_nodes):
        depth[n] = depth[parent[n]] + 1
    for d, (a, b) in enumerate(zip(cat.level_ptr[:-1], cat.level_ptr[1:])):
        assert (depth[a:b] == d).all()
    assert cat.max_degree()[0] == len({c[0] for c in codes})


def test_allow_list_reachability():
    codes = [[1], [1, 2], [1, 3, 4], [5, 6]]
    cat = Catalogue.from_sequences([10, 11, 12, 13], codes)
    ends, reach = cat.reachable([12])
    assert [bool(reach[cat.lookup(p)]) for p in ([], [1], [1, 2], [1, 3], [1, 3, 4], [5], [5, 6])] == \
        [True, True, False, True, True, False, False]
    assert ends.sum() == 1 and ends[cat.lookup([1, 3, 4])]
    ends, reach = cat.reachable(None)
    assert reach.all() and ends.sum() == 4
    with pytest.raises(ConfigError, match=r"\[99\] are not in the catalogue"):
        cat.reachable([10, 99])


def test_save_and_load(tmp_path):
    cat = Catalogue.from_sequences([3, 4], [[1, 2], [1]], {"vocab_size": 100, "sha256": None})
    meta = cat.save(tmp_path / "c")
    assert meta["items"] == 2 and meta["depth"] == 2 and meta["nodes"] == 3
    again = Catalogue.load(tmp_path / "c")
    for name in ("row_ptr", "child_token", "node_item", "level_ptr"):
        assert np.array_equal(getattr(again, name), getattr(cat, name))
    meta["sha256"] = "0" * 64
    (tmp_path / "c" / "catalogue.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="sha256"):
        Catalogue.load(tmp_path / "c")
    with pytest.raises(ConfigError, match="not a catalogue directory"):
        Catalogue.load(tmp_path)


def write(tmp_path, lines, raw: bytes | None = None):
    path = tmp_path / "items.jsonl"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("lines, message", [
    (['{"item_id": 1, "token_ids": [1]}', '{"item_id": 2, "token_ids": [2'], r"line 2: not valid JSON"),
    ([[1, 2]], r"line 1: expected a JSON object"),
    ([{"token_ids": [1]}], r"line 1: no item_id"),
    ([{"item_id": 1}], r"line 1: give exactly one of token_ids and text"),
    ([{"item_id": 1, "token_ids": [1], "text": "a"}], r"line 1: give exactly one"),
    ([{"item_id": 1, "token_ids": [1], "score": 3}], r"line 1: unknown fields \['score'\]"),
    ([{"item_id": -1, "token_ids": [1]}], r"line 1: item_id must be an integer in \[0, 2\^63\)"),
    ([{"item_id": "7", "token_ids": [1]}], r"line 1: item_id must be an integer"),
    ([{"item_id": True, "token_ids": [1]}], r"line 1: item_id must be an integer"),
    ([{"item_id": 1, "token_ids": [1, 2.0]}], r"line 1: token_ids must be a list of integers"),
    ([{"item_id": 1, "token_ids": []}], r"line 1: token_ids are empty"),
    ([{"item_id": 1, "token_ids": [1]}, {"item_id": 2, "token_ids": [100]}],
     r"line 2: token id 100 is outside the tokenizer's vocabulary \[0, 100\)"),
    ([{"item_id": 1, "token_ids": [-3]}], r"line 1: token id -3 is outside"),
    ([{"item_id": 1, "token_ids": [1, 2, 3, 4]}], r"line 1: token_ids are 4 tokens, more than --max-depth 3"),
    ([{"item_id": 1, "text": ""}], r"line 1: text must be a non-empty string"),
    (['{"item_id": 1, "text": "a\\ud800"}'],
     r"line 1: the text is not valid UTF-8 text: it holds a lone surrogate"),
    ([{"item_id": 1, "text": "abcd"}], r"line 1: the text's tokens are 4 tokens, more than --max-depth 3"),
    ([{"item_id": 5, "token_ids": [1]}, {"item_id": 6, "token_ids": [2]}, {"item_id": 5, "token_ids": [3]}],
     r"lines 1 and 3: item_id 5 appears twice"),
    ([{"item_id": 5, "token_ids": [1, 2]}, {"item_id": 6, "token_ids": [2]}, {"item_id": 7, "token_ids": [1, 2]}],
     r"lines 1 and 3: items 5 and 7 have the same token sequence"),
    (["", " "], r"holds no items"),
    (['{"item_id": 1, "token_ids": [1], "item_id": 2}'], r"line 1: field 'item_id' is given twice"),
    # a key spelt with an escape is the same key: the last used to win silently
    (['{"item_id": 1, "item\\u005fid": 2, "token_ids": [1]}'], r"line 1: field 'item_id' is given twice"),
    (['{"item_id": 1, "token_ids": [1], "token\\u005fids": [2]}'], r"line 1: field 'token_ids' is given twice"),
    (['{"item_id": 1, "token_ids": ' + "[" * 5000 + "]" * 5000 + "}"], r"line 1: JSON nested too deeply"),
])
def test_bad_items_name_their_line(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        build_catalogue(write(tmp_path, lines), FakeTokenizer(), max_depth=3)


def test_a_key_as_a_value_is_no_duplicate(tmp_path):
    cat = build_catalogue(write(tmp_path, [{"item_id": 1, "text": "item_id"}]), FakeTokenizer(), max_depth=9)
    assert cat.num_items == 1


def test_not_utf8_names_the_line(tmp_path):
    path = write(tmp_path, None, raw=b'{"item_id": 1, "token_ids": [1]}\n{"item_id": 2, "text": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8"):
        build_catalogue(path, FakeTokenizer())


def test_blank_lines_count_in_line_numbers(tmp_path):
    path = write(tmp_path, ['{"item_id": 1, "token_ids": [1]}', "", '{"item_id": 1, "token_ids": [2]}'])
    with pytest.raises(ConfigError, match=r"lines 1 and 3"):
        build_catalogue(path, FakeTokenizer())


def test_cli_build_with_texts_and_ids(tmp_path, tiny_qwen3_dir, capsys):
    from boundgen.text.tokenizer import Tokenizer

    items = write(tmp_path, [{"item_id": 1, "text": "running shoes"}, {"item_id": 2, "token_ids": [5, 6]},
                             {"item_id": 3, "text": "running socks"}])
    out = tmp_path / "cat"
    assert main(["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["items"] == 3 and summary["tokenizer"]["vocab_size"] == Tokenizer.from_dir(tiny_qwen3_dir).vocab_size
    cat = Catalogue.load(out)
    shoes = Tokenizer.from_dir(tiny_qwen3_dir).ids(["running shoes"])[0]
    assert cat.node_item[cat.lookup(shoes)] == 1 and cat.node_item[cat.lookup([5, 6])] == 2
    check_tokenizer(cat, tiny_qwen3_dir, out)  # the same tokenizer: accepted
    # A non-empty directory is refused, --force replaces an earlier catalogue.
    assert main(["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir), "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir), "--out", str(out), "--force"]) == 0


def test_cli_build_checks_its_paths_before_reading_and_reads_a_pipe(tmp_path, tiny_qwen3_dir, capsys):
    items = write(tmp_path, [{"item_id": 1, "token_ids": [5, 6]}])
    base = ["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir)]
    assert main([*base, "--out", str(items / "cat")]) == 2  # the items file is where a directory would go
    assert "a file is in the way" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "cat"), "--max-depth", "6"]) == 2
    assert "--max-depth must be in [1, 5]" in capsys.readouterr().err
    read, write_end = os.pipe()  # a pipe, as /dev/stdin or <(...) give one: it was "is not a file"
    os.write(write_end, items.read_bytes())
    os.close(write_end)
    try:
        assert main(["catalogue", "build", f"/dev/fd/{read}", "--tokenizer", str(tiny_qwen3_dir),
                     "--out", str(tmp_path / "piped")]) == 0
    finally:
        os.close(read)
    assert Catalogue.load(tmp_path / "piped").num_items == 1


def test_another_tokenizer_is_refused(tmp_path, tiny_qwen3_dir):
    cat = Catalogue.from_sequences([1], [[5]], {"vocab_size": 100, "sha256": "0" * 64})
    with pytest.raises(ConfigError, match="another tokenizer"):
        check_tokenizer(cat, tiny_qwen3_dir, "cat")


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "catalogue.json").write_text("[1, 2]"), "a JSON object was expected"),
    (lambda d: (d / "catalogue.json").write_text(
        json.dumps({**json.loads((d / "catalogue.json").read_text()), "tokenizer": "x"})), "is damaged"),
    (lambda d: (d / "trie.npz").write_bytes((d / "trie.npz").read_bytes()[:100]), "trie.npz is missing or damaged"),
])
def test_a_damaged_catalogue_directory_is_a_clear_error(tmp_path, damage, message):
    """A cut index was a BadZipFile, a catalogue.json that is not an object an AttributeError: the CLI's
    "internal error" and the server's 500 where a ConfigError (exit 2, 400) names the file."""
    cat = Catalogue.from_sequences(np.array([1, 2]), [[5, 6], [5, 7]], {"vocab_size": 100, "sha256": None})
    cat.save(tmp_path / "cat")
    damage(tmp_path / "cat")
    with pytest.raises(ConfigError, match=message):
        Catalogue.load(tmp_path / "cat")


def _edited(**arrays):
    """A good catalogue with some of its arrays replaced: saved by `save`, so its sha256 fits."""
    def edit(cat):
        for name, value in arrays.items():
            setattr(cat, name, value(getattr(cat, name)) if callable(value) else value)
    return edit


def _set(values, at, value):
    values = values.copy()
    values[at] = value
    return values


@pytest.mark.parametrize("edit, message", [
    (_edited(child_token=lambda t: _set(t, 1, -5)), "not ids in ascending order"),  # the server aborted on it
    (_edited(child_token=lambda t: t[::-1].copy()), "not ids in ascending order"),
    (_edited(row_ptr=lambda r: r.astype(np.float64)), "not lists of integers"),
    (_edited(node_item=lambda n: n[None, :]), "not lists of integers"),
    (_edited(row_ptr=lambda r: _set(r, 1, 3)), "do not fit together"),
    (_edited(level_ptr=lambda lp: _set(lp, 1, 2)), "do not fit together"),
    (_edited(node_item=lambda n: np.full_like(n, -1)), "the catalogue has no items"),
    (_edited(node_item=lambda n: np.where(n >= 0, 7, n)), "not distinct ids"),
    (_edited(node_item=lambda n: np.where(n == 1, -7, n)), "not distinct ids"),
])
def test_a_catalogue_that_is_no_trie_is_refused_though_its_sha256_fits(tmp_path, edit, message):
    """The loader checked the arrays' lengths and their hash only: a negative token id loaded (and the
    next request aborted the server), float or 2-D arrays were a TypeError (500), a catalogue without
    items served nothing but -1s, repeated or negative item ids came back as items."""
    cat = Catalogue.from_sequences(np.array([1, 2, 3]), [[5, 6], [5, 7], [8]], {"vocab_size": 100, "sha256": None})
    edit(cat)
    cat.save(tmp_path / "cat")
    with pytest.raises(ConfigError, match=message):
        Catalogue.load(tmp_path / "cat")


def test_a_catalogue_json_that_cannot_be_read_is_a_clear_error(tmp_path):
    """A directory where catalogue.json should be was an IsADirectoryError (500 on the load route)."""
    (tmp_path / "cat" / "catalogue.json").mkdir(parents=True)
    with pytest.raises(ConfigError, match="catalogue.json cannot be read"):
        Catalogue.load(tmp_path / "cat")


def test_an_allow_list_names_only_items(tmp_path):
    """-1 marks the trie's nodes where no item ends: it was taken for an item of the catalogue; an id past
    int64 was an OverflowError."""
    cat = Catalogue.from_sequences(np.array([1, 2]), [[5, 6], [5, 7]], {"vocab_size": 100, "sha256": None})
    for ids in ([1, -1], [2 ** 64], [1, "2"]):
        with pytest.raises(ConfigError, match="are not in the catalogue"):
            cat.allowed_ids(ids)
        with pytest.raises(ConfigError, match="are not in the catalogue"):
            cat.reachable(ids)
    assert cat.allowed_ids([2, 1, 2]).tolist() == [1, 2]
