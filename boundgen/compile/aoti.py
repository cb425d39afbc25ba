"""ExportedPrograms -> AOTInductor packages (`<name>.pt2`), and the weights file beside them.

A score artifact has one package, `model.pt2`; a beam artifact one per stage (`prefill.pt2`,
`step.pt2`, `finish.pt2`, programs/beam.py), all reading the same weights file.

Two ways to ship weights (the `weights` build option; docs/build.md has the measurement):
- "external": the package holds code only (`aot_inductor.package_constants_in_so=False`);
  the weights go to `weights.safetensors`, which the loader memory-maps and hands to the
  package with `load_constants(..., user_managed=True)` (no copy on CPU).
- "packaged": the weights are linked into the package's shared object (AOTInductor's default).

Custom ops (`torch.library.triton_op`): on CPU, AOTInductor would inline their Triton kernels,
which needs a GPU driver, so CPU builds run under `decompose_custom_triton_ops=False` and the
package calls the op by name (its CPU kernel, the torch reference); a loading process must
have imported `boundgen.ops` first. On CUDA the kernels are compiled into the package.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHTS_FILE = "weights.safetensors"


def inductor_configs(weights: str) -> dict:
    return {"aot_inductor.package_constants_in_so": weights == "packaged"}


def package_file(name: str) -> str:
    return f"{name}.pt2"


def called_ops(ep: torch.export.ExportedProgram) -> list[str]:
    """The boundgen ops (by module name in boundgen/ops/) the exported program calls by name; the
    manifest records them so a loading process registers them first (ops/custom.py). Some are
    decomposed into their Triton kernels on CUDA, but registering those costs only an import."""
    names = {node.target.name().split("::")[1].split(".")[0] for node in ep.graph.nodes
             if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
             and node.target.namespace == "boundgen"}
    return sorted(names)


def compile_package(ep: torch.export.ExportedProgram, out_dir: Path, device: str, weights: str,
                    name: str = "model") -> Path:
    """Compile with AOTInductor into out_dir/<name>.pt2; returns its path."""
    path = Path(out_dir) / package_file(name)
    options = inductor_configs(weights)
    keep_custom_ops = torch._functorch.config.patch(decompose_custom_triton_ops=False) if device == "cpu" \
        else contextlib.nullcontext()
    with keep_custom_ops, unique_int_array_owners(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # torch-internal noise
        torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=options)
    return path


@contextlib.contextmanager
def unique_int_array_owners():
    """Work around an AOTInductor codegen race: the C++ wrapper caches its `int_array_N`
    declarations by `id()` of the `writeline` it was given: torch 2.13 keys on the buffer behind
    it, 2.11 on the bound method itself, a temporary object made at each attribute access. Either
    can be freed during codegen and its address reused by a new one, which then gets the old
    declaration's name without the declaration: "int_array_26 was not declared in this scope"
    (2 of 3 beam builds on the H200, 2026-11-29; a W1 build with add_rmsnorm, 2026-12-01, when
    only the buffers were kept). Keeping every `writeline` (and so its buffer) alive until the
    compile ends makes both ids unique."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        yield
        return
    original = getattr(CppWrapperCpu, "codegen_int_array_var", None)
    if original is None:
        yield
        return
    owners: list = []

    def codegen_int_array_var(self, int_array, writeline, *args, **kwargs):
        owners.append(writeline)
        return original(self, int_array, writeline, *args, **kwargs)

    CppWrapperCpu.codegen_int_array_var = codegen_int_array_var
    try:
        yield
    finally:
        CppWrapperCpu.codegen_int_array_var = original
        owners.clear()


def write_weights(eps: list[torch.export.ExportedProgram], out_dir: Path) -> Path:
    """Save the exported programs' parameters, buffers and constants, by FQN, to weights.safetensors
    (the beam stages share their FQNs: one entry each).

    A package asks for a subset by `get_constant_fqns()` (small buffers it folded in are not
    asked for); a name it asks for and this file lacks fails validation, at build time."""
    tensors, seen = {}, set()
    named: dict[str, torch.Tensor] = {}
    for ep in eps:
        for name, t in {**ep.state_dict, **ep.constants}.items():
            other = named.setdefault(name, t)
            if other is not t and not (isinstance(t, torch.Tensor) and torch.equal(other, t)):
                raise ValueError(f"two stages export different tensors under one name {name!r}")
    for name, t in sorted(named.items()):
        if not isinstance(t, torch.Tensor):
            continue  # script objects: none in our programs
        t = t.detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        tensors[name] = t.clone() if key in seen else t  # safetensors refuses shared storage
        seen.add(key)
    path = Path(out_dir) / WEIGHTS_FILE
    save_file(tensors, str(path), metadata={"format": "pt", "written_by": "boundgen build"})
    path.chmod(0o644)  # safetensors writes 0600; a server may run as another user
    return path
