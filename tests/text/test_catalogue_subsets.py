"""Named subsets registered with a catalogue (an item's "subsets" when it is built): what a request
names with ALLOW_SUBSET. They are saved and loaded with the trie, covered by its sha256 (a
catalogue without subsets hashes as before), checked as they are read (each error naming its
line), and `allowed_ids` gives the ids a request allows: its allow-list within its subset."""

import json

import numpy as np
import pytest

from boundgen.errors import ConfigError
from boundgen.text import catalogue as catalogue_module
from boundgen.text.catalogue import SUBSETS_FILE, Catalogue
from boundgen.text.catalogue_items import build_catalogue
from tests.text.test_catalogue import FakeTokenizer, write

ITEMS = [{"item_id": 1, "token_ids": [1, 2], "subsets": ["shoes", "sale"]},
         {"item_id": 2, "token_ids": [1, 3], "subsets": ["shoes"]},
         {"item_id": 3, "token_ids": [4]},
         {"item_id": 4, "token_ids": [5, 6], "subsets": ["sale"]}]


def built(tmp_path, items=ITEMS):
    return build_catalogue(write(tmp_path, items), FakeTokenizer())


def test_subsets_are_read_saved_and_loaded(tmp_path):
    cat = built(tmp_path)
    assert {name: ids.tolist() for name, ids in cat.subsets.items()} == {"shoes": [1, 2], "sale": [1, 4]}
    meta = cat.save(tmp_path / "c")
    assert meta["subsets"] == {"sale": 2, "shoes": 2} and (tmp_path / "c" / SUBSETS_FILE).is_file()
    again = Catalogue.load(tmp_path / "c")
    assert {name: ids.tolist() for name, ids in again.subsets.items()} == {"sale": [1, 4], "shoes": [1, 2]}
    assert again.content_sha256() == cat.content_sha256()


def test_the_sha256_covers_the_subsets_and_is_unchanged_without_them(tmp_path):
    plain = built(tmp_path, [{k: v for k, v in item.items() if k != "subsets"} for item in ITEMS])
    assert plain.subsets == {} and "subsets" not in plain.metadata()
    assert Catalogue.from_sequences([1, 2, 3, 4], [[1, 2], [1, 3], [4], [5, 6]]).content_sha256() == \
        plain.content_sha256()
    with_subsets = built(tmp_path)
    assert with_subsets.content_sha256() != plain.content_sha256()
    other = with_subsets.with_subsets({"shoes": [1, 2], "sale": [4]})
    assert other.content_sha256() != with_subsets.content_sha256()
    # A subsets file changed on disk no longer matches the catalogue's sha256.
    with_subsets.save(tmp_path / "c")
    np.savez(tmp_path / "c" / SUBSETS_FILE, shoes=np.array([1, 2, 3]), sale=np.array([1, 4]))
    with pytest.raises(ConfigError, match="sha256"):
        Catalogue.load(tmp_path / "c")
    (tmp_path / "c" / SUBSETS_FILE).unlink()
    with pytest.raises(ConfigError, match="subsets.npz is missing or damaged"):
        Catalogue.load(tmp_path / "c")


def test_rebuilding_without_subsets_removes_the_old_file(tmp_path):
    built(tmp_path).save(tmp_path / "c")
    plain = Catalogue.from_sequences([1, 2], [[1], [2]])
    plain.save(tmp_path / "c")
    assert not (tmp_path / "c" / SUBSETS_FILE).exists()
    assert Catalogue.load(tmp_path / "c").subsets == {}


@pytest.mark.parametrize("subsets, message", [
    ("shoes", r"line 1: subsets must be a list of names"),
    (["shoes", 3], r"line 1: subset name 3 is not"),
    ([""], r"line 1: subset name '' is not"),
    (["a b"], r"line 1: subset name 'a b' is not"),
    (["x" * 65], r"line 1: subset name 'x+' is not"),
])
def test_bad_subsets_name_their_line(tmp_path, subsets, message):
    with pytest.raises(ConfigError, match=message):
        built(tmp_path, [{"item_id": 1, "token_ids": [1], "subsets": subsets}])


def test_subsets_are_bounded_and_hold_catalogue_items(tmp_path, monkeypatch):
    cat = Catalogue.from_sequences([1, 2], [[1], [2]])
    with pytest.raises(ConfigError, match=r"subset 'x': items \[9\] are not in the catalogue"):
        cat.with_subsets({"x": [1, 9]})
    with pytest.raises(ConfigError, match="subset 'x' has no items"):
        cat.with_subsets({"x": []})
    monkeypatch.setattr(catalogue_module, "MAX_SUBSETS", 2)
    with pytest.raises(ConfigError, match="3 subsets, more than the 2 a catalogue may register"):
        built(tmp_path, [{"item_id": 1, "token_ids": [1], "subsets": ["a", "b", "c"]}])


def test_allowed_ids_is_the_list_within_the_subset(tmp_path):
    cat = built(tmp_path)
    assert cat.allowed_ids() is None
    assert cat.allowed_ids(subset="sale").tolist() == [1, 4]
    assert cat.allowed_ids([4, 2, 2]).tolist() == [2, 4]
    assert cat.allowed_ids([4, 2, 3], "shoes").tolist() == [2]
    assert cat.allowed_ids([3], "shoes").tolist() == []
    with pytest.raises(ConfigError, match=r"allowed items \[9\] are not in the catalogue"):
        cat.allowed_ids([9, 2], "shoes")
    with pytest.raises(ConfigError, match=r"no subset 'hats' \(its subsets: sale, shoes\)"):
        cat.allowed_ids([2], "hats")


def test_cli_summary_lists_the_subsets(tmp_path, tiny_qwen3_dir, capsys):
    from boundgen.cli.main import main

    items = write(tmp_path, ITEMS)
    out = tmp_path / "c"
    assert main(["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["subsets"] == {"sale": 2, "shoes": 2}
