"""Load a built artifact directory into an engine (`boundgen.load(path)`).

Checks, in order, each refusing with an ArtifactError that says what differs:
  1. manifest.json: schema, required keys, its own hash (build/manifest.py);
  2. every file's sha256 against the manifest (a tampered or truncated file is named);
  3. device: a CUDA artifact needs a CUDA device of the same compute capability;
  4. versions: torch major.minor (and CUDA major for GPU artifacts) as at build time;
  5. the runtime DAG this boundgen builds for the spec equals the recorded topology;
  6. on systems where loading a package crashes without a preloaded libstdc++
     (runtime/libstdcxx.py), that the process has it.
Then the custom ops are imported, the AOTInductor package and its weights loaded, and the
DAG engine assembled (runtime/assemble.py) with the manifest's concurrency settings.
"""

from __future__ import annotations

from pathlib import Path

import torch

from boundgen.build import manifest as mf
from boundgen.errors import ArtifactError, ConfigError
from boundgen.programs.spec import spec_from_dict
from boundgen.runtime import libstdcxx
from boundgen.runtime.assemble import make_dag, make_dag_engine
from boundgen.runtime.executor import DagEngine
from boundgen.text.tokenizer import Tokenizer


def load_artifact_engine(path, contexts: int | None = None, executors: int | None = None,
                         cuda_graphs: bool | None = None, verify_files: bool = True, batching: bool | None = None,
                         libstdcxx_check: str = "auto") -> DagEngine:
    """The engine for an artifact directory. contexts / executors / cuda_graphs override the
    manifest's runtime config; libstdcxx_check is "auto" (refuse where the load would crash),
    "require" (refuse unless preloaded, on any Linux) or "skip"."""
    root = Path(path)
    manifest = mf.read_manifest(root)
    try:
        return _load(root, manifest, contexts, executors, cuda_graphs, verify_files, libstdcxx_check, batching)
    except KeyError as exc:
        raise ArtifactError(f"{root / mf.MANIFEST_FILE} lacks the entry {exc}; rebuild the artifact") from None


def _load(root: Path, manifest: dict, contexts, executors, cuda_graphs, verify_files, libstdcxx_check,
          batching=None) -> DagEngine:
    if verify_files:
        mf.verify_files(root, manifest)
    device = _check_device(manifest)
    mf.check_versions(manifest)
    runtime, compiled = manifest["runtime"], manifest["compile"]
    try:
        spec = spec_from_dict(manifest["program"])
    except (ConfigError, TypeError) as exc:
        raise ArtifactError(f"{root / mf.MANIFEST_FILE} has an invalid program spec: {exc}") from None
    tokenizer = Tokenizer.from_dir(root)
    topology = make_dag(spec, tokenizer, runner=None).topology()
    if topology != runtime["topology"]:
        raise ArtifactError(f"artifact {manifest['name']} records a runtime DAG that this boundgen does not build "
                            f"(recorded {runtime['topology']}, expected {topology}); rebuild the artifact")
    _check_libstdcxx(libstdcxx_check)

    from boundgen.runtime.compiled import load_runner

    executors = executors or runtime.get("executors", 1)
    cuda_graphs = runtime.get("cuda_graphs", False) if cuda_graphs is None else cuda_graphs
    custom_ops = [op for op, impl in compiled["lowering"].items() if impl != "torch"]
    packages = compiled["packages"]
    try:
        runner = load_runner(root, packages, compiled.get("weights_file"), device,
                             getattr(spec, "steps", 0), executors, custom_ops,
                             single_threaded=cuda_graphs and device.type == "cuda")
    except (RuntimeError, KeyError) as exc:
        raise ArtifactError(f"could not load the compiled package of {manifest['name']}: {exc!s}") from None
    extra = {"artifact_dir": str(root.resolve()), "lowering": compiled["lowering"], "weights": compiled["weights"],
             "gpu_name": compiled.get("gpu_name"), "validation_passed": manifest["validation"]["passed"]}
    return make_dag_engine(manifest["name"], spec, tokenizer, runner, str(device), compiled["dtype"],
                           contexts=contexts or runtime.get("contexts", 1), executors=executors,
                           cuda_graphs=cuda_graphs,
                           token_bucket=runtime.get("token_bucket", 256), extra=extra,
                           batching=runtime.get("batching", False) if batching is None else batching)


def _check_device(manifest: dict) -> torch.device:
    compiled = manifest["compile"]
    device = torch.device(compiled["device"])
    if device.type != "cuda":
        return device
    built_on = f"{compiled.get('gpu_name')} (compute capability {compiled.get('gpu_capability')})"
    if not torch.cuda.is_available():
        raise ArtifactError(f"artifact {manifest['name']} was built for {device} on {built_on}, "
                            "but this process sees no CUDA device")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ArtifactError(f"artifact {manifest['name']} was built for {device}; this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s)")
    here = ".".join(map(str, torch.cuda.get_device_capability(device)))
    if compiled.get("gpu_capability") and here != compiled["gpu_capability"]:
        raise ArtifactError(f"artifact {manifest['name']} was compiled for {built_on}; this GPU "
                            f"({torch.cuda.get_device_name(device)}) has compute capability {here}: rebuild it here")
    return device


def _check_libstdcxx(mode: str) -> None:
    if mode == "skip":
        return
    if mode not in ("auto", "require"):
        raise ValueError(f"libstdcxx_check must be auto, require or skip, got {mode!r}")
    if mode == "require" and libstdcxx.is_preloaded():
        return
    lib = libstdcxx.missing_preload() if mode == "auto" else (libstdcxx.system_libstdcxx() or "libstdc++.so.6")
    if lib is not None:
        raise ArtifactError(libstdcxx.missing_preload_message(lib))
