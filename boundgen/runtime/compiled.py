"""The program's runner for a built artifact: its AOTInductor packages plus their weights.

`CompiledRunner(package, weights, device, executors)` loads one package once (`weights`: the
tensors `load_weights` read from the weights file); `executors`
model instances share one set of weights, so that many calls may run at once. A call takes
the program's input tensors (on the artifact's device) and returns its outputs as a list, on
the caller's current CUDA stream. A score artifact is one package ("model"); a beam artifact
is three ("prefill", "step", "finish", see programs/beam.py) sharing one weights file, chained
by `BeamStagesRunner` with the stage protocol the eager program uses (artifact/tensors.py). `load_runner` makes the
right one; the loader and build-time validation both use it, so that the build checks exactly
what a deployment runs.

`single_threaded=True` is for CUDA graph capture (runtime/graphs.py): AOTInductor's
thread-aware run records a CUDA event per call and queries it before reusing a model
instance, which a capturing stream does not allow; its single-threaded run does neither. It
has one model instance, so calls are serialised here (replays of captured graphs do not call
the runner at all).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.tensors import SCORE_PACKAGE, STAGES, run_stages
from boundgen.errors import ArtifactError
from boundgen.ops.custom import import_custom_ops

PACKAGE_MODEL = "model"  # the model's name inside a package written by aoti_compile_and_package


def device_index(device: torch.device) -> int:
    return -1 if device.type != "cuda" or device.index is None else device.index


def load_weights(path: str | Path, device: torch.device) -> dict[str, torch.Tensor]:
    """A weights file's tensors: memory-mapped on CPU, copied to the device otherwise. A file that is
    not valid safetensors (its header corrupt, even where the manifest's hash matches it) is an
    ArtifactError naming it."""
    try:
        return load_file(str(path), device="cpu" if device.type == "cpu" else str(device))
    except SafetensorError as exc:
        raise ArtifactError(f"{Path(path).name} is not a valid safetensors file ({exc}); rebuild the artifact") from None


def load_runner(root: str | Path, packages: dict[str, str], weights_file: str | None, device: str | torch.device,
                steps: int = 0, runtime: RuntimeConfig = RuntimeConfig(), custom_ops: list[str] = ()):
    """The runner for an artifact's packages ({name: file} under root): a CompiledRunner for one
    "model" package, a BeamStagesRunner for the beam stages. One copy of the weights serves all.
    `runtime`: the settings in effect; `executors` model instances, single-threaded with CUDA graphs."""
    root, device = Path(root), torch.device(device)
    import_custom_ops(custom_ops)
    weights = load_weights(root / weights_file, device) if weights_file else None
    runners = {name: CompiledRunner(root / file, weights, device, runtime.executors,
                                    single_threaded=runtime.cuda_graphs, weights_name=weights_file)
               for name, file in packages.items()}
    if set(runners) == {SCORE_PACKAGE}:
        return runners[SCORE_PACKAGE]
    return BeamStagesRunner(runners, steps, device)


class BeamStagesRunner:
    """The beam search over its compiled stages (`artifact.tensors.run_stages`), the step index
    tensors allocated once (stable addresses for CUDA graph capture)."""

    def __init__(self, stages: dict, steps: int, device: torch.device):
        if set(stages) != set(STAGES) or steps < 1:
            raise KeyError(f"a beam artifact needs packages {', '.join(STAGES)} and steps >= 1; "
                           f"got {', '.join(sorted(stages))}, steps {steps}")
        self.stages, self.steps = stages, steps
        self.step_ids = [torch.full((1,), s, dtype=torch.int64, device=device) for s in range(steps - 1)]

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, *trie) -> list:
        """trie: a constrained artifact's TRIE tensors (artifact/tensors.py), on its device."""
        s = self.stages
        return run_stages(s["prefill"], s["step"], s["finish"], self.step_ids, tokens, positions, cu_seqlens, trie)


class CompiledRunner:
    def __init__(self, package: str | Path, weights: dict[str, torch.Tensor] | None, device: str | torch.device,
                 executors: int = 1, single_threaded: bool = False, weights_name: str = "weights"):
        """weights: the weights file's tensors (`load_weights`; one load serves several packages),
        or None when they are inside the package; weights_name names the file in errors. The
        package's custom ops must be imported first (`load_runner` does)."""
        self.device = torch.device(device)
        # The C++ loader directly: `torch._inductor.package.load_package` wraps the same class but
        # importing torch._inductor costs seconds, and its per-call pytree work costs microseconds.
        runners = 1 if single_threaded else max(1, executors)
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(package), PACKAGE_MODEL, single_threaded, runners,
                                                            device_index(self.device))
        self._serial = threading.Lock() if single_threaded else contextlib.nullcontext()
        self.weights = None
        if weights is not None:
            # The package reads these tensors in place (user_managed), so keep them.
            needed = self.loader.get_constant_fqns()
            missing = sorted(set(needed) - set(weights))
            if missing:
                raise KeyError(f"weights file {weights_name} lacks {', '.join(missing[:5])}")
            self.weights = {name: weights[name] for name in needed}
            # (constants, use_inactive, check_full_update, user_managed)
            self.loader.load_constants(self.weights, False, True, True)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        # boxed_run takes ownership of (and clears) the list it is given.
        with self._serial:
            return self.loader.boxed_run(list(inputs))
