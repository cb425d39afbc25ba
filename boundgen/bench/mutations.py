"""Which arguments of boundgen's Triton kernels torch believes each kernel writes.

When a build exports a registered Triton op, functionalization clones every input that torch's
analysis of the kernel (its TTIR) says is written; a clone of a tensor that later ops read again
stays in the graph. This prints what the installed torch finds, kernel by kernel, against what each
kernel really writes:

    python -m boundgen.bench.mutations        (on the GPU machine: its torch and triton)

Each op's launcher runs on small tensors with its `wrap_triton` replaced by a recorder, so the
analysis sees exactly the arguments a build passes; nothing is launched.

On the H200 (torch 2.11, 2026-12-01) and on CPU (torch 2.13) the analysis finds exactly the real
outputs. The per-call copies that the beam step's and W1's C++ wrappers showed (the suffix length
once per prefix-attention call, RoPE's cos / sin once per `rope_kv_write` or q/k-norm + RoPE call)
are not clones: a cheap pointwise value read by several opaque kernels is recomputed by Inductor
into a buffer for each reader (`should_realize_on_reuse`: it realizes a reused pointwise node only
past `realize_reads_threshold` reads or a large inner function).
"""

from __future__ import annotations

import argparse
import importlib
from contextlib import contextmanager
from typing import Callable

import torch

from boundgen.ops import (decode_attention, packed_attention, prefix_attention, qk_norm_rope, rmsnorm, rope,
                          rope_kv_write)

# (case, op module whose launcher runs, call, the arguments the kernel really writes)
Case = tuple[str, object, Callable[[torch.device], object], tuple[str, ...]]


def _cases() -> list[Case]:
    bf16 = torch.bfloat16

    def t(device, *shape, dtype=bf16):
        return torch.zeros(shape, dtype=dtype, device=device)

    def cos_sin(device, rows, head_dim):
        return rope.cos_sin(torch.arange(rows, device=device), rope.inv_freq(head_dim, 1e6).to(device), bf16)

    return [
        ("prefix_attention", prefix_attention,
         lambda d: prefix_attention.launch(t(d, 4, 14, 64), t(d, 8, 2, 64), t(d, 8, 2, 64), t(d, 4, 3, 2, 64),
                                           t(d, 4, 3, 2, 64), torch.zeros(1, dtype=torch.int64, device=d),
                                           torch.tensor([0, 8], dtype=torch.int32, device=d), 4, 0.125),
         ("out_ptr",)),
        ("rope_kv_write", rope_kv_write,
         lambda d: rope_kv_write.launch(t(d, 4, 18 * 64), *cos_sin(d, 4, 64), t(d, 2, 4, 3, 2, 64),
                                        t(d, 2, 4, 3, 2, 64), torch.zeros(1, dtype=torch.int64, device=d), 1, 14, 2),
         ("q_ptr", "sk_ptr", "sv_ptr")),
        ("decode_attention", decode_attention,
         lambda d: decode_attention.launch(t(d, 4, 18 * 64), *cos_sin(d, 4, 64), t(d, 8, 2, 64), t(d, 8, 2, 64),
                                           t(d, 2, 4, 3, 2, 64), t(d, 2, 4, 3, 2, 64),
                                           torch.zeros(1, dtype=torch.int64, device=d),
                                           torch.tensor([0, 8], dtype=torch.int32, device=d), 1, 4, 0.125, 14, 2),
         ("sk_ptr", "sv_ptr", "out_ptr")),
        ("qk_norm_rope", qk_norm_rope,
         lambda d: qk_norm_rope.launch(t(d, 4, 32 * 128), t(d, 128), t(d, 128), *cos_sin(d, 4, 128), 1e-6, 16, 8),
         ("q_ptr", "k_ptr")),
        ("add_rmsnorm", rmsnorm,
         lambda d: rmsnorm.launch(t(d, 4, 1024), t(d, 1024), 1e-6, delta=t(d, 4, 1024)),
         ("out_ptr", "sum_ptr")),
        ("packed_attention", packed_attention,
         lambda d: packed_attention.launch(t(d, 8, 16, 128), t(d, 8, 8, 128), t(d, 8, 8, 128),
                                           torch.tensor([0, 8], dtype=torch.int32, device=d), 0.088),
         ("out_ptr",)),
        ("packed_attention_stacked", packed_attention,
         lambda d: packed_attention.launch_stacked(t(d, 8, 16, 128), t(d, 8, 8, 128), t(d, 8, 8, 128),
                                                   torch.tensor([0, 8], dtype=torch.int32, device=d), 0.088),
         ("out_ptr",)),
    ]


@contextmanager
def _recording(module, calls: list):
    """Replace `module.wrap_triton` by a recorder of (kernel, arguments by name)."""
    def wrap(kernel):
        def launch(*args, **kwargs):
            bound = dict(zip(kernel.arg_names, args), **kwargs)
            calls.append((kernel, {k: v for k, v in bound.items() if k in kernel.arg_names}))

        class Grid:
            def __getitem__(self, grid):
                return launch
        return Grid()

    saved = module.wrap_triton
    module.wrap_triton = wrap
    try:
        yield
    finally:
        module.wrap_triton = saved


def written(kernel, kwargs: dict) -> list[str]:
    """The tensor arguments torch's analysis says `kernel` writes (either API torch has had)."""
    wrap = importlib.import_module("torch._higher_order_ops.triton_kernel_wrap")
    if hasattr(wrap, "identify_accessed_tensors"):
        accesses = wrap.identify_accessed_tensors(kernel, kwargs, {})
        names = [dep.name for dep in accesses.read_writes.writes]
    else:  # before torch 2.13; the TMA metadata argument came in later than the function
        try:
            names = list(wrap.identify_mutated_tensors(kernel, kwargs, {}))
        except TypeError:
            names = list(wrap.identify_mutated_tensors(kernel, kwargs))
    return [n for n in names if isinstance(kwargs.get(n), torch.Tensor)]


def require_gpu_target() -> None:
    """The analysis compiles each kernel for the GPU's target; where triton has none, torch's
    analysis fails and reports every argument as written: refuse instead."""
    import triton
    try:
        triton.runtime.driver.active.get_current_target()
    except Exception as exc:
        raise RuntimeError(f"the analysis compiles each kernel for the GPU's target, and triton has none here "
                           f"({type(exc).__name__}: {exc}); run it on the GPU machine") from None


def analyse(device: torch.device) -> list[dict]:
    """One row per case: the arguments torch believes written, the real outputs, the difference."""
    require_gpu_target()
    rows = []
    for case, module, call, outputs in _cases():
        calls: list = []
        with _recording(module, calls):
            call(device)
        for kernel, kwargs in calls:
            believed = written(kernel, kwargs)
            rows.append({"case": case, "kernel": kernel.fn.__name__, "written": believed, "outputs": list(outputs),
                         "copied": [n for n in believed if n not in outputs]})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"torch {torch.__version__}: arguments each kernel is believed to write", "",
             "| case | kernel | believed written | really written | believed, not written |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | `{r['kernel']}` | {', '.join(r['written'])} | {', '.join(r['outputs'])} "
                     f"| {', '.join(r['copied']) or 'none'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m boundgen.bench.mutations", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the small tensors live (the analysis needs a GPU target: cuda, or a test's stand-in)")
    try:
        rows = analyse(torch.device(p.parse_args(argv).device))
    except RuntimeError as exc:
        raise SystemExit(f"boundgen.bench.mutations: {exc}") from None
    print(markdown(rows))


if __name__ == "__main__":
    main()
