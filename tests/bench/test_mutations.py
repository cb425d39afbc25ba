"""bench.mutations: torch's analysis of which arguments each boundgen Triton kernel writes. With
the torch of this machine (2.13) it finds exactly the real outputs, as the H200's torch 2.11 did
(2026-12-01); a kernel whose code made the analysis see more would have its inputs cloned on every
call in a build. The analysis compiles each kernel to TTIR for an sm_90 target, outside the
interpreter, so it runs in a process of its own."""

import json
import subprocess
import sys

import pytest

from tests.ops.kernel_testing import env_without_interpreter

_SCRIPT = """
import json, torch, triton
from triton.backends.compiler import GPUTarget

class Sm90:  # what the active driver says on an H200; this machine has no GPU
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

triton.runtime.driver.set_active(Sm90())
from boundgen.bench import mutations
rows = mutations.analyse(torch.device("cpu"))
print(json.dumps(rows))
print(mutations.markdown(rows), file=sys.stderr)
"""


@pytest.mark.slow
def test_the_analysis_finds_only_the_real_outputs():
    out = subprocess.run([sys.executable, "-c", "import sys\n" + _SCRIPT], env=env_without_interpreter(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert {r["case"] for r in rows} == {"prefix_attention", "rope_kv_write", "decode_attention", "qk_norm_rope",
                                         "add_rmsnorm", "packed_attention", "packed_attention_stacked"}
    for r in rows:
        assert sorted(r["written"]) == sorted(r["outputs"]) and r["copied"] == [], (r, out.stderr)


def test_a_kernel_believed_to_write_an_input_is_reported(monkeypatch):
    """The report names an argument believed written that is not an output (the analysis stubbed:
    the copy this module exists to find)."""
    import torch

    from boundgen.bench import mutations
    monkeypatch.setattr(mutations, "require_gpu_target", lambda: None)
    monkeypatch.setattr(mutations, "written", lambda kernel, kwargs: ["out_ptr", "step_ptr"])
    rows = [r for r in mutations.analyse(torch.device("cpu")) if r["case"] == "prefix_attention"]
    assert rows and rows[0]["copied"] == ["step_ptr"]
    assert "| step_ptr |" in mutations.markdown(rows)


def test_without_a_gpu_target_it_refuses_instead_of_reporting_everything_written():
    """Without a target torch's analysis fails and says every argument is written: the tool says why
    it cannot answer, in one line, and exits non-zero."""
    out = subprocess.run([sys.executable, "-m", "boundgen.bench.mutations"], env=env_without_interpreter(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "run it on the GPU machine" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "believed written" not in out.stdout
