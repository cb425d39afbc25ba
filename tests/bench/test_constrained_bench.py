"""The constrained beam harness (bench/constrained.py): a random catalogue written for a model's
tokenizer, the constrained artifact's rows beside the plain one's, and candidates checked against
the catalogue (a candidate whose tokens do not name its item is not counted as one)."""

import json

import numpy as np
import pytest

from boundgen.bench.constrained import check_row, main, names_item
from boundgen.runtime.results import BeamResult
from boundgen.text.catalogue import Catalogue, tokenizer_sha256
from tests.compile.conftest import BEAM_OPTIONS, _build

STOP = 151643  # the tiny checkpoints' eos_token_id


def test_candidates_are_counted_as_items_only_where_their_tokens_name_them():
    cat = Catalogue.from_sequences([7, 8, 9], [[40, 50], [40, 51, 60], [41]])
    assert names_item(cat, [40, 50, STOP], [STOP]) == 7  # a code shorter than N, then the stop token
    assert names_item(cat, [40, 51, 60], [STOP]) == 8
    assert names_item(cat, [40, 51], [STOP]) == -1  # a prefix names nothing
    result = BeamResult(token_ids=np.array([[40, 50, STOP], [40, 51, 60], [41, STOP, -1], [-1, -1, -1]]),
                        scores=np.array([-1.0, -2.0, -3.0, -np.inf], dtype=np.float32),
                        finished=np.array([True, False, True, False]), texts=[""] * 4,
                        item_ids=np.array([7, 9, 9, -1]), timings={"model": 0.001})
    row = check_row("constrained", [result], [1.0], [1.0], cat, [STOP])
    assert (row.candidates, row.missing, row.items_ok) == (4, 1, 2)  # item 9 given to item 8's tokens
    allowed = check_row("allow", [result], [1.0], [1.0], cat, [STOP], allow_items=[9])
    assert allowed.items_ok == 1  # item 7 is outside the allow-list
    plain = check_row("plain", [BeamResult(result.token_ids, result.scores, result.finished, [""] * 4,
                                           timings={"model": 0.001})], [1.0], [1.0], cat, [STOP])
    assert (plain.missing, plain.items_ok) == (0, 3)


@pytest.fixture(scope="module")
def plain_artifact(tiny_qwen2_dir, tmp_path_factory):
    return _build(tiny_qwen2_dir, tmp_path_factory.mktemp("plain") / "beam", BEAM_OPTIONS)[0]


@pytest.mark.slow  # two AOTInductor builds (the constrained one shared with tests/compile)
def test_harness_writes_a_catalogue_and_reports_every_search(constrained_build, plain_artifact, tmp_path, capsys):
    art, cat_dir = constrained_build["artifact"], tmp_path / "cat"
    assert main(["--make-catalogue", str(cat_dir), "--items", "40", "--code-length", "2", "--code-vocab", "64",
                 "--subset-items", "2", "--model-dir", str(art)]) == 0
    cat = Catalogue.load(cat_dir)
    assert (cat.num_items, cat.depth) == (40, 2) and int(cat.child_token.max()) < 64
    assert list(cat.subsets) == ["sample2"] and len(cat.subsets["sample2"]) == 2
    assert cat.tokenizer["sha256"] == tokenizer_sha256(art)
    capsys.readouterr()

    out = tmp_path / "report.json"
    code = main([str(art), "--catalogue", str(cat_dir), "--plain", str(plain_artifact), "--requests", "3",
                 "--warmup", "1", "--allow-items", "2", "--prompt-tokens", "16", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(out.read_text())
    rows = {r["search"]: r for r in report["rows"]}
    assert list(rows) == ["constrained", "constrained, allow-list of 2", "constrained, subset sample2 of 2", "plain"]
    assert (report["items"], report["depth"]) == (40, 2) and report["subsets"] == {"sample2": 2}
    assert report["derive_ms"] > 0
    width = BEAM_OPTIONS["width"]
    for r in rows.values():
        assert r["requests"] == 3 and r["candidates"] == 3 * width
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["model_mean_ms"] > 0 and 0 < r["pre_mean_ms"] < r["mean_ms"]
    whole = rows["constrained"]  # 40 items, W=4: every slot an item
    assert (whole["missing"], whole["items_ok"], whole["items_fraction"]) == (0, 3 * width, 1.0)
    allow = rows["constrained, allow-list of 2"]  # two items reachable: two slots of each request are -1
    assert (allow["missing"], allow["items_ok"]) == (3 * (width - 2), 3 * 2)
    named = rows["constrained, subset sample2 of 2"]  # the same two items, named: the same counts
    assert (named["missing"], named["items_ok"]) == (allow["missing"], allow["items_ok"])
    assert rows["plain"]["missing"] == 0
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4 and table[0].startswith("| search | requests | mean ms | p50 ms | p99 ms |")


def test_a_title_like_catalogue_over_the_real_vocabulary(tiny_qwen2_dir, tmp_path, capsys):
    """--titles: Zipf-distributed sequences cut to --code-length, some shorter, over the ordinary
    tokens; the catalogue is recorded for the model's tokenizer."""
    cat_dir = tmp_path / "titles"
    assert main(["--make-catalogue", str(cat_dir), "--items", "500", "--code-length", "3", "--code-vocab", "151643",
                 "--titles", "--model-dir", str(tiny_qwen2_dir)]) == 0
    printed = json.loads(capsys.readouterr().out)
    cat = Catalogue.load(cat_dir)
    assert cat.num_items == printed["items"] == 500 and cat.depth == 3
    lengths = np.diff(cat.level_ptr)  # nodes a level: fewer at depth 3 than items (some titles end earlier)
    assert int(cat.child_token.max()) < 151643 and lengths[-1] < 500
    assert cat.tokenizer["sha256"] == tokenizer_sha256(tiny_qwen2_dir)
