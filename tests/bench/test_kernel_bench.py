"""Kernel benchmark: its work accounting and table on CPU; the timed run on the GPU."""

import os

import pytest
import torch

from boundgen.bench import kernel_timing, kernels, selection
from boundgen.ops import vocab_topk


def test_packed_work_counts_causal_pairs_and_unique_bytes():
    flops, nbytes = kernels.packed_work([1, 3], num_q_heads=4, num_kv_heads=2, head_dim=16)
    assert flops == 4 * 16 * 4 * (1 + 6)  # pairs: 1 + (1 + 2 + 3)
    assert nbytes == 4 * (2 * 4 + 2 * 2) * 16 * 2


def test_prefix_work_counts_the_prefix_once():
    flops, nbytes = kernels.prefix_work(10, prefix_len=5, suffix_len=2, num_q_heads=4,
                                        num_kv_heads=2, head_dim=16)
    assert flops == 4 * 16 * 4 * 10 * 7
    assert nbytes == (2 * 10 * 4 + 2 * (5 + 10 * 2) * 2) * 16 * 2


def test_markdown_table_reports_time_throughput_and_bandwidth():
    row = kernels.KernelTiming("case", "triton", time_us=10.0, flops=1e9, bytes=4e7, max_abs_err=0.01)
    assert row.tflops == pytest.approx(100.0) and row.gbps == pytest.approx(4000.0)
    table = kernel_timing.markdown_table([row]).splitlines()
    assert len(table) == 3 and table[2].startswith("| case | triton | 10.0 | 100.0 | 10.1 | 4000 | 97.6 |")


def test_roofline_table_reports_bytes_bandwidth_and_the_tensor_peak_of_gemm_like_rows():
    gemm = kernel_timing.KernelTiming("attn", "triton", 10.0, 1e9, 4e7, 0.01, kernel_timing.PEAK_BF16_FLOPS)
    norm = kernel_timing.KernelTiming("norm", "triton", 10.0, 0.0, 2.4e7, 0.0)
    table = kernel_timing.roofline_table([gemm, norm], hbm_peak=4.0e12).splitlines()
    assert "% HBM peak (4.0 TB/s)" in table[0] and len(table) == 4
    assert table[2] == "| attn | triton | 10.0 | 40.00 | 4000 | 100.0 | 1.00 | 10.1 | 1.00e-02 |"
    assert table[3] == "| norm | triton | 10.0 | 24.00 | 2400 | 60.0 |  |  | 0.00e+00 |"


def test_w1_lengths_are_seeded_and_in_range():
    lengths = kernels.w1_lengths(seed=3)
    assert lengths == kernels.w1_lengths(seed=3) and len(lengths) == 15
    assert all(48 <= n <= 256 for n in lengths)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
                    reason="needs CUDA and compiled kernels (on a GPU machine run with TRITON_INTERPRET=0)")
def test_gpu_kernel_benchmark_runs_small():
    rows = kernels.bench_prefix(8, 64, 2, calls=2, replays=2)
    rows += kernels.bench_packed([48, 100], calls=2, replays=2)
    elementwise = kernels.bench_elementwise(calls=2, replays=2)
    assert all(r.time_us > 0 for r in rows + elementwise)
    assert all(r.max_abs_err < 2e-2 for r in rows), kernel_timing.markdown_table(rows)
    # bf16 outputs reach ~25 (silu_mul of randn): two ulp there are 0.25
    assert all(r.max_abs_err <= 0.25 for r in elementwise), kernel_timing.markdown_table(elementwise)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_every_implementation_agrees_with_the_reference_on_cpu(monkeypatch):
    """The benchmark's SDPA wrappers (padding, concatenation) and kernel variants compute the same
    attention; timing replaced, kernels interpreted, tiny fp32 shapes."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_packed([5, 1, 9], heads=(4, 2), head_dim=16, device="cpu", dtype=torch.float32)
    rows += kernels.bench_prefix(3, 7, 2, heads=(4, 2), head_dim=16, device="cpu", dtype=torch.float32)
    rows += kernels.bench_prefix(3, 7, 2, heads=(4, 2), head_dim=16, device="cpu", dtype=torch.float32,
                                 requests=3)  # packed requests: no SDPA variants
    # D=16's default launch config is not in the one-head sweep: every entry runs; of the packed-heads
    # sweep, the first is D=16's default with pack 2 (the `triton_gqa` row)
    assert len(rows) == 5 + len(kernels.PACKED_SWEEP) + len(kernels.PACKED_GQA_SWEEP) - 1 + 5 + 3
    assert all(r.max_abs_err < 1e-5 for r in rows), kernel_timing.markdown_table(rows)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_stacked_sweep_times_each_config_against_the_reference_on_cpu(monkeypatch):
    """The stacked kernel's sweep entries compute the reference's attention; a config equal to the
    default (64 x 64 tiles, 8 warps, pack 2 at D=16) is timed once, as `triton_stacked`."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    configs = [(16, 16, 4, 2, 2), (32, 16, 4, 3, 1), (64, 64, 8, 2, 2), (16, 16, 4, 2, 2, True)]
    rows = kernels.bench_packed([5, 1, 20], heads=(4, 2), head_dim=16, device="cpu", dtype=torch.float32,
                                configs=(), stacked_configs=configs)
    assert [r.impl for r in rows] == ["triton", "triton_gqa", "triton_stacked", "torch reference", "sdpa (padded)",
                                      "stacked m16 n16 w4 s2 pack2", "stacked m32 n16 w4 s3 pack1",
                                      "stacked m16 n16 w4 s2 pack2 tma"]
    assert all(r.max_abs_err < 1e-5 for r in rows), kernel_timing.markdown_table(rows)


def test_stacked_sweep_runs_w1_calls_of_each_request_count(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "bench_packed", lambda lengths, **kw: calls.append((lengths, kw)) or [])
    kernels.bench_packed_stacked(requests=(1, 4), configs=[(64, 64, 8, 2, 2)], calls=3)
    assert [len(lengths) for lengths, _ in calls] == [15, 60]
    assert calls[0][0] == kernels.w1_lengths() and calls[1][0][:15] == kernels.w1_lengths()
    assert all(kw == dict(configs=(), stacked_configs=[(64, 64, 8, 2, 2)], calls=3) for _, kw in calls)
    assert len(kernels.PACKED_STACKED_GRID) <= 24  # about two minutes of an H200, compiles included


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_elementwise_benchmarks_agree_with_the_reference_on_cpu(monkeypatch):
    """The elementwise cases build the inputs the kernels expect (views included); timing
    replaced, kernels interpreted, tiny fp32 shapes."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    kw = dict(device="cpu", dtype=torch.float32)
    rows = (kernels.bench_rmsnorm(5, 48, **kw) + kernels.bench_rmsnorm(5, 16, num_heads=3, **kw)
            + kernels.bench_rope(5, 3, 16, strided=True, **kw)
            + kernels.bench_rope(5, 3, 16, strided=False, **kw)
            + kernels.bench_silu_mul(5, 40, **kw))
    assert [r.impl for r in rows] == ["triton", "torch reference"] * 5
    assert all(r.max_abs_err < 1e-5 for r in rows), kernel_timing.markdown_table(rows)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_selection_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """The selection case: every lowering (the Triton sweep included) finds the reference's log-probs
    on LM-head-like logits; the table reports speedup over (a) and the multiple of the GEMM."""
    times = {"torch reference": 40.0, "lm-head GEMM (scale)": 10.0}
    monkeypatch.setattr(selection, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = selection.bench_vocab_topk(3, 10, vocab=1024, hidden=16, device="cpu")
    assert [r.impl for r in rows] == (["torch reference", "torch-lse", "triton"]
                                      + [f"triton block {b} w{w} s{st}" for b, w, st in selection.SELECTION_SWEEP]
                                      + ["chunks", "chunks-triton", "chunks-triton w8", "chunks-triton w32"]
                                      + [f"chunks {vocab_topk.chunk_size(1024, 10, c)} tile {t} seg {sg} w{w}"
                                         for c, t, sg, w in selection.CHUNKS_SWEEP]
                                      + ["chunk_max kernel alone", "lm-head GEMM (scale)"])
    assert all(r.max_abs_err < 1e-5 for r in rows[:-2]), kernel_timing.markdown_table(rows)
    rows = [kernels.KernelTiming(r.case, r.impl, times.get(r.impl, 4.0), r.flops, r.bytes, r.max_abs_err)
            for r in rows]
    table = selection.selection_table(rows).splitlines()
    assert table[4].startswith("| selection rows=3 V=1024 K=10 | triton | 4.0 | 10.00 | 0.40 |")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_qk_norm_rope_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """Every form of q/k norm + RoPE (compiled reference, separate Triton ops, the fused kernel and
    its sweep) gives the reference's q and k: within one bf16 ulp of values up to ~4."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_qk_norm_rope(5, heads=(4, 2), head_dim=16, device="cpu")
    assert [r.impl for r in rows] == (["torch reference", "inductor (reference compiled)",
                                       "triton rmsnorm + rope (4 launches)", "fused triton"]
                                      + [f"fused block_t {b} w{w}" for b, w in kernels.QK_NORM_ROPE_SWEEP])
    assert all(r.max_abs_err <= 0.04 for r in rows), kernel_timing.markdown_table(rows)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_packed_qk_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """The separate kernels and the fused one (its default and a swept config) give the reference
    composition's attention (FP32: the interpreter's bf16 dot is wrong); bytes as counted from the
    shapes: the separate pair moves the rotated q and k twice more."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_packed_qk([3, 18], heads=(4, 2), head_dim=32, device="cpu", dtype=torch.float32,
                                   configs=[(16, 16, 4, 2)])
    assert [r.impl for r in rows] == ["qk_norm_rope + triton_gqa", "fused triton", "fused m16 n16 w4 s2"]
    assert all(r.max_abs_err < 1e-5 for r in rows), kernel_timing.markdown_table(rows)
    fused = 21 * (6 + 6) * 32 * 4 + (2 * 21 * 32 + 2 * 32) * 4
    assert [r.bytes for r in rows] == [fused + 2 * 21 * 6 * 32 * 4, fused, fused]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_rope_kv_write_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """The fused kernel gives the reference's q and slot exactly; Inductor's compile of the reference
    within a bf16 ulp (it keeps RoPE's intermediate products in FP32, ops/rope.py)."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_rope_kv_write(6, heads=(4, 2), head_dim=16, slots=3, layers=2, device="cpu", block_ts=(1, 4))
    assert [r.impl for r in rows] == ["torch reference", "inductor (reference compiled)", "fused triton",
                                      "fused triton, BLOCK_T=1", "fused triton, BLOCK_T=4"]
    errors = [r.max_abs_err for r in rows]
    assert errors[0] == errors[2] == errors[3] == errors[4] == 0 and errors[1] <= 0.04, kernel_timing.markdown_table(rows)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_decode_attention_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """The fused kernel and the pair it replaces give the reference's attention (within FP32 rounding)
    and its slot; the bytes count qkv once beside the prefix attention's."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_decode_attention(2, 5, width=3, heads=(4, 2), head_dim=16, slots=4, layers=2, device="cpu",
                                          dtype=torch.float32)
    assert [r.impl for r in rows] == ["torch reference", "rope_kv_write + prefix_attention (2 launches)",
                                      "fused triton (1 launch)"]
    assert all(r.max_abs_err < 1e-5 for r in rows), kernel_timing.markdown_table(rows)
    _, prefix_bytes = kernels.prefix_work(3, 5, 3, 4, 2, 16, 4)
    assert rows[0].bytes == 2 * prefix_bytes + 6 * 8 * 16 * 4


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_silu_quant_benchmark_agrees_with_the_reference_on_cpu(monkeypatch):
    """Every form of SwiGLU + E4M3 quantization dequantizes to the reference's values within an
    E4M3 ulp of the row's largest (a 1/8 of its scale x 448, at most)."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    rows = kernels.bench_silu_quant(4, inter=64, device="cpu", configs=((1, 4), (2, 4)))
    assert [r.impl for r in rows] == ["torch reference", "inductor (reference compiled)", "triton, IEEE divisions",
                                      "triton, fast divisions, BLOCK_T=1 w4", "triton, fast divisions, BLOCK_T=2 w4"]
    assert rows[0].max_abs_err == 0 and all(r.max_abs_err < 1.0 for r in rows), kernel_timing.markdown_table(rows)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_memory_bound_benchmark_agrees_with_the_references_on_cpu(monkeypatch):
    """Every variant and launch config of the memory-bound mode gives its op's reference (E4M3
    dequantized), with inputs rotated as `--cold` rotates them; bytes as counted from the shapes."""
    monkeypatch.setattr(kernel_timing, "gpu_time_us", lambda fn, calls, replays: 1.0)
    monkeypatch.setattr(kernels, "COLD_BYTES", 2000)
    rows = kernels.bench_memory_bound(5, ("new", "old"), sweep=True, cold=True, device="cpu", dtype=torch.float32,
                                      hidden=48, heads=(4, 2), head_dim=16, inter=40)
    names = {r.case.split(" ")[0] for r in rows}
    assert names == {"rmsnorm", "add_rmsnorm", "add_rmsnorm_quant", "qk_norm_rope", "silu_quant"}
    per_norm = 2 + len(kernels.MEMORY_BOUND_SWEEP["rmsnorm"])
    assert len(rows) == 3 * per_norm + 2 + len(kernels.QK_NORM_ROPE_SWEEP) + 2 + len(kernels.MEMORY_BOUND_SWEEP["silu_quant"])
    bytes_of = {r.case.split(" ")[0]: r.bytes for r in rows}
    assert bytes_of["add_rmsnorm"] == (4 * 5 * 48 + 48) * 4 and bytes_of["silu_quant"] == 5 * (40 * 9 + 4)
    assert bytes_of["qk_norm_rope"] == (2 * 5 * 6 * 16 + 2 * 5 * 16 + 2 * 16) * 4
    assert all(r.max_abs_err < 1e-4 or (r.case.startswith(("add_rmsnorm_quant", "silu_quant")) and r.max_abs_err < 1.0)
               for r in rows), kernels.roofline_table(rows)


def test_command_line_asks_for_a_benchmark_and_checks_its_token_counts(capsys):
    with pytest.raises(SystemExit) as exc:
        kernels.main([])
    assert exc.value.code == 2 and "name at least one benchmark" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernels.main(["--silu-quant", "2250,x"])
    assert "positive token counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        kernels.main(["--memory-bound", "--variant", "new,newer"])
    assert "--variant takes" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert kernels.main(["--silu-quant", "2250"]) == 2
        assert "need a CUDA device" in capsys.readouterr().err
