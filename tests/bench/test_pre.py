"""bench/pre.py: every stage of `pre` timed on the same requests, and its stages compose to what
the packer gives (timings themselves are not checked: benchmarks are not tests)."""

import json

import pytest

from boundgen.artifact.program import ScoreSpec
from boundgen.bench import pre
from boundgen.bench.workloads import WORKLOADS, make_requests
from boundgen.runtime.requests import RequestPacker
from boundgen.text.template import Template
from boundgen.text.tokenizer import Tokenizer, pack_arrays

pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def packer(tiny_qwen3_dir):
    tok = Tokenizer.from_dir(tiny_qwen3_dir, joined=True)
    spec = ScoreSpec(labels=(" yes", " no"), label_token_ids=tok.label_token_ids((" yes", " no")),
                     template="<|im_start|>user\n{text}<|im_end|>\n")
    return RequestPacker(tok, spec)


def test_the_stages_compose_to_the_packers_batch(packer):
    tok, template = packer.tokenizer, Template(packer.bounds.template)
    for request in make_requests(WORKLOADS["W1"], tok, 3):
        texts = list(request.texts)
        tok.check_texts(texts, [f"sample {i}" for i in range(len(texts))])
        staged = pack_arrays(*tok.token_array([template.render(t) for t in texts]))
        whole = packer.encode(texts)
        assert staged.lengths == whole.lengths
        for a, b in ((staged.tokens, whole.tokens), (staged.positions, whole.positions),
                     (staged.cu_seqlens, whole.cu_seqlens)):
            assert a.dtype == b.dtype and a.tolist() == b.tolist()


def test_stage_times_and_loaded_pre_cover_every_stage(packer):
    pool = [list(r.texts) for r in make_requests(WORKLOADS["W1"], packer.tokenizer, 2)]
    stages = pre.stage_times(packer, pool, rounds=1)
    assert list(stages) == ["check", "template", "ids", "ids, lists", "pack", "pre"]
    assert all(s["ms"] >= 0 and s["median_ms"] >= s["ms"] and s["cpu_ms"] >= 0 for s in stages.values())
    loaded = pre.loaded_pre(packer, pool, threads=2, busy=True, per_thread=2)
    assert loaded["threads"] == 2 and loaded["busy_thread"] and loaded["p99_ms"] >= 0
    cold = pre.cold_pre(packer, pool, evict_mb=1, requests=3)
    assert cold["evict_mb"] == 1 and cold["p99_ms"] >= cold["mean_ms"] > 0


def test_command_prints_both_modes(tiny_qwen3_dir, tmp_path, capsys):
    out = tmp_path / "pre.json"
    assert pre.main(["--tokenizer", str(tiny_qwen3_dir), "--requests", "2", "--rounds", "1", "--concurrency", "1",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## text by text (tiktoken)" in printed and "## joined (tiktoken, joined)" in printed
    assert "| ids | " in printed and "1 thread beside a busy Python thread" in printed
    assert "| 1 thread, caches emptied first (64 MB copied) |" in printed
    result = json.loads(out.read_text())
    assert set(result["modes"]) == {"text by text", "joined"} and result["host"]["cpu_model"]
    with pytest.raises(ValueError, match="W2 is a beam workload: give its artifact"):
        pre.measure(tiny_qwen3_dir, artifact=False, workload="W2")
