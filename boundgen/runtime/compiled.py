"""The model node's runner for a built artifact: an AOTInductor package plus its weights.

`CompiledRunner(package, weights, device, executors)` loads the package once; `executors`
model instances share one set of weights, so that many calls may run at once. A call takes
the packed input tensors (on the artifact's device) and returns the program's outputs as a
list, on the caller's current CUDA stream. Used by the loader and by build-time validation,
so that the build checks exactly what a deployment runs.

`single_threaded=True` is for CUDA graph capture (runtime/graphs.py): AOTInductor's
thread-aware run records a CUDA event per call and queries it before reusing a model
instance, which a capturing stream does not allow; its single-threaded run does neither. It
has one model instance, so calls are serialised here (replays of captured graphs do not call
the runner at all).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from pathlib import Path

import torch

PACKAGE_MODEL = "model"  # the model's name inside a package written by aoti_compile_and_package


def import_ops(ops: list[str]) -> None:
    """Import `boundgen.ops.<op>` for each op, registering the custom ops a package may call by
    name. Only ops lowered to something other than their torch reference need it (importing a
    `triton_op` module pulls in torch._inductor: seconds)."""
    for op in ops:
        importlib.import_module(f"boundgen.ops.{op}")


def device_index(device: torch.device) -> int:
    return -1 if device.type != "cuda" or device.index is None else device.index


class CompiledRunner:
    def __init__(self, package: str | Path, weights: str | Path | None, device: str | torch.device,
                 executors: int = 1, custom_ops: list[str] = (), single_threaded: bool = False):
        from safetensors.torch import load_file

        import_ops(list(custom_ops))
        self.device = torch.device(device)
        # The C++ loader directly: `torch._inductor.package.load_package` wraps the same class but
        # importing torch._inductor costs seconds, and its per-call pytree work costs microseconds.
        runners = 1 if single_threaded else max(1, executors)
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(package), PACKAGE_MODEL, single_threaded, runners,
                                                            device_index(self.device))
        self._serial = threading.Lock() if single_threaded else contextlib.nullcontext()
        self.weights = None
        if weights is not None:
            # Memory-mapped on CPU; the package reads these tensors in place (user_managed), so keep them.
            state = load_file(str(weights), device="cpu" if self.device.type == "cpu" else str(self.device))
            needed = self.loader.get_constant_fqns()
            missing = sorted(set(needed) - set(state))
            if missing:
                raise KeyError(f"weights file {Path(weights).name} lacks {', '.join(missing[:5])}")
            self.weights = {name: state[name] for name in needed}
            # (constants, use_inactive, check_full_update, user_managed)
            self.loader.load_constants(self.weights, False, True, True)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        # boxed_run takes ownership of (and clears) the list it is given.
        with self._serial:
            return self.loader.boxed_run(list(inputs))
