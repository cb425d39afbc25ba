"""The catalogue benchmark end to end on tiny sizes on the CPU (Triton kernels under the
interpreter, checked equal to their references), its random codes, and its refusals."""

import numpy as np
import pytest

from boundgen.bench import catalogue as bench

IMPLS = ["torch bias", "triton bias", "torch bias + add", "triton bias + add", "torch in place", "triton in place",
         "torch allowed list + gather"]


def test_runs_end_to_end_on_cpu(capsys):
    code = bench.main(["--items", "300", "--beams", "2", "--vocab", "2048", "--code-vocab", "40",
                       "--code-length", "2", "--allow", "50", "--repeats", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert any(line.startswith("| 300 | ") and line.count("|") == 10 for line in lines)  # the build row
    sweep = [f"triton in place, block {b} w{w}" for b, w in bench.BLOCK_SWEEP]
    for step, rows in ((0, 1), (1, 2), (2, 2)):
        case = [line for line in lines if f"| mask, step {step} " in line]
        assert [line.split(" | ")[3] for line in case] == IMPLS + sweep and all(f"| {rows} |" in line for line in case)
        checked = [line for line in case if line.split(" | ")[3] in ["triton bias", "triton in place"] + sweep]
        assert len(checked) == 2 + len(sweep) and all(line.endswith("| yes |") for line in checked)
    for step in (1, 2):  # a decode step's selection: the plain one, the mask's, the gathered top K's
        case = [line for line in lines if f"| selection, step {step} (K=200) | 2 |" in line]
        names = [line.split(" | ")[3] for line in case]
        assert names[:2] == ["plain, vocab_topk chunks", "mask + topk over V"] and len(names) == 4
        assert names[2].startswith("gathered top K, D=") and names[3] == "gathered top K, D=4096"
        assert all(line.endswith("| yes |") for line in case[2:])
    assert sum("| walk, 3 columns | 2 | torch |" in line for line in lines) == 1
    reach = [line for line in lines if "allow-list of 50 items" in line]
    assert [line.split(" | ")[3] for line in reach] == ["reach from ids", "reach from ids, path table",
                                                          "reach from bitmap", "numpy Catalogue.reachable (host)"]
    assert all(line.endswith("| yes |") for line in reach[:3])
    assert "left out" not in out and "| NO |" not in out


def test_random_codes_are_distinct():
    codes = bench.random_codes(500, 2, 40, seed=3)
    assert codes.shape == (500, 2) and codes.max() < 40
    assert len(np.unique(codes, axis=0)) == 500
    with pytest.raises(ValueError, match="need a code vocabulary above 20"):
        bench.random_codes(300, 2, 20)


def test_title_codes_are_distinct_skewed_and_sometimes_short():
    titles = bench.title_codes(3000, 4, 5000, seed=2)
    assert len(titles) == 3000 and len({tuple(t) for t in titles}) == 3000
    assert all(1 <= len(t) <= 4 for t in titles) and max(max(t) for t in titles) < 5000
    assert 0.03 < sum(len(t) < 4 for t in titles) / 3000 < 0.2  # a tenth drawn short (repeats among them drop)
    firsts = np.bincount([t[0] for t in titles], minlength=5000)
    assert firsts.max() > 10 * 3000 / 5000  # a few common first tokens: far above a uniform draw's share
    with pytest.raises(ValueError, match="could not draw 30 distinct titles"):
        bench.title_codes(30, 1, 4)


def test_cli_refuses_bad_flags(capsys):
    assert bench.main(["--items", "1000,x"]) == 2
    assert "--items must be comma-separated positive integers" in capsys.readouterr().err
    assert bench.main(["--beams", "0"]) == 2
    assert bench.main(["--items", "10", "--vocab", "100", "--code-vocab", "100", "--device", "cpu"]) == 2
    assert "must be below --vocab 100" in capsys.readouterr().err
