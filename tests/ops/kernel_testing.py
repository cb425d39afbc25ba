"""What the kernel tests share: where a Triton kernel runs in this process (the interpreter on CPU
tensors, which tests/conftest.py turns on without a GPU, else compiled on CUDA), the skip markers
that follow from it, and running a script in a fresh Python process (for what the interpreter
cannot do: tracing with wrap_triton, compiling an AOTInductor package)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_DEVICE = "cpu" if INTERPRETED else ("cuda" if torch.cuda.is_available() else None)
needs_kernel = pytest.mark.skipif(KERNEL_DEVICE is None,
                                  reason="needs TRITON_INTERPRET=1 or a CUDA device")
needs_compiled_kernel = pytest.mark.skipif(
    INTERPRETED or not torch.cuda.is_available(),
    reason="needs CUDA and compiled kernels (on a GPU machine run with TRITON_INTERPRET=0)")


def env_without_interpreter(preload_libstdcxx: bool = False) -> dict:
    """This process's environment less TRITON_INTERPRET, so that kernels compile (and wrap_triton
    traces). `preload_libstdcxx` adds the system libstdc++ to LD_PRELOAD: the H200 image's AOTI
    load crash: docs/build.md."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    preload = _libstdcxx() if preload_libstdcxx else None
    if preload:
        env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), preload]))
    return env


def _libstdcxx() -> str | None:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in listing.splitlines():
        if "libstdc++.so.6 " in line:
            return line.rsplit(" ", 1)[-1]
    return None


def assert_script_prints_ok(script: str, *argv: str, env: dict | None = None, timeout: int = 300,
                            stderr_tail: int = 3000) -> None:
    """Run `script` with `argv` in a fresh Python process (`env`, by default this environment less
    TRITON_INTERPRET): it must exit 0 and print "ok"; else the tail of its stderr is the message."""
    env = env_without_interpreter() if env is None else env
    result = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-stderr_tail:]


def one_kernel_trace_script(trace: str, grid_checks: str = "") -> str:
    """A script for `assert_script_prints_ok` that checks what Inductor does to an op on the GPU:
    trace the launcher with symbolic shapes into one kernel call whose grid stays an expression of
    T (no host sync, no specialisation on T). It runs `trace` (which must bind `graph`, made by
    make_fx with tracing_mode="symbolic"), then asserts the graph holds one Triton kernel call
    whose grid's first size is a graph node, after `grid_checks` on `grid`. Run it in a fresh
    process without the interpreter, where wrap_triton can trace (the default env)."""
    return "\n".join([
        "import torch",
        "from torch.fx.experimental.proxy_tensor import make_fx",
        textwrap.dedent(trace).strip("\n"),
        'hops = [n for n in graph.nodes if "triton_kernel_wrapper" in str(n.target)]',
        "assert len(hops) == 1, graph",
        'grid = hops[0].kwargs["grid"][0]',
        textwrap.dedent(grid_checks).strip("\n"),
        'assert isinstance(grid[0], torch.fx.Node), "grid size must stay symbolic in T"',
        'print("ok")',
        ""])


def call_targets(exported) -> list:
    """The ops an exported program calls, in graph order: what the export tests count."""
    return [n.target for n in exported.graph.nodes if n.op == "call_function"]
