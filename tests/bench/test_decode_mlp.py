"""The decode MLP tail benchmark: on CPU (the kernels under the interpreter) every implementation
gives the reference's (h, y); its CLI refuses bad row counts and a machine without CUDA."""

import os

import pytest

from boundgen.bench import decode_mlp, kernel_timing


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_every_implementation_agrees_with_the_reference_on_cpu(monkeypatch):
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    sweep = [(16, 16, 16, 4, 2, 32), (32, 32, 32, 4, 2, 64)]
    rows = decode_mlp.bench_decode_mlp(5, hidden=32, inter=96, sweep=sweep, device="cpu", cold=False)
    assert [r.impl for r in rows] == (["inductor + cublas", "triton swiglu_down + add_rmsnorm"]
                                      + [f"triton, config {tuple(c)} k_split {k}" for *c, k in sweep])
    # bf16 h (values ~3-10) and y: a bf16 ulp or two where the roundings' order differs
    assert all(r.max_abs_err <= 0.07 for r in rows), decode_mlp.markdown_table(rows)


def test_cli_refuses_bad_rows_and_no_cuda(capsys, monkeypatch):
    monkeypatch.setattr(decode_mlp.torch.cuda, "is_available", lambda: True)
    assert decode_mlp.main(["--rows", "100,x"]) == 2
    assert "comma-separated positive integers" in capsys.readouterr().err
    assert decode_mlp.main(["--rows", "0"]) == 2
    monkeypatch.setattr(decode_mlp.torch.cuda, "is_available", lambda: False)
    assert decode_mlp.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
