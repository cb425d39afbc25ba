"""Load a built artifact directory into an engine (`boundgen.load(path)`).

Checks, in order, each refusing with an ArtifactError that says what differs:
  1. manifest.json: version, required keys, its own hash (artifact/manifest.py);
  2. every file's sha256 against the manifest (a tampered or truncated file is named);
  3. device: a CUDA artifact needs a CUDA device of the same compute capability;
  4. versions: torch major.minor (and CUDA major for GPU artifacts) as at build time;
  5. on systems where loading a package crashes without a preloaded libstdc++
     (runtime/libstdcxx.py), that the process has it.
Then the custom ops the packages call are registered (ops/custom.py), the AOTInductor packages
and their weights loaded (runtime/compiled.py), and the engine assembled (runtime/local_engine.py)
with the manifest's runtime settings, each overridable here without a rebuild. Nothing here
imports the model or the programs: a compiled artifact is served from its packages alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from boundgen.artifact.manifest import Manifest, check_versions, read_manifest, verify_files as verify_artifact_files
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import TRIE_LAYOUT, has_vocab_outputs
from boundgen.errors import ArtifactError, ConfigError
from boundgen.runtime import libstdcxx
from boundgen.runtime.compiled import load_runner
from boundgen.runtime.engine import Provenance
from boundgen.runtime.local_engine import LocalEngine, make_engine, settings_in_effect
from boundgen.text.tokenizer import Tokenizer
from boundgen.version import __version__


def load_artifact_engine(path, verify_files: bool = True, libstdcxx_check: str = "auto", fast_tokenizer: bool = True,
                         joined_tokenizing: bool = True, catalogue: str | Path | None = None,
                         **runtime) -> LocalEngine:
    """The engine for an artifact directory. `runtime`: RuntimeConfig fields (artifact/manifest.py:
    contexts, batching, ...) that override the manifest's settings (None: as built), checked by
    RuntimeConfig's own rules; libstdcxx_check is "auto" (refuse where the load would crash), "require"
    (refuse unless preloaded, on any Linux) or "skip"; fast_tokenizer=False encodes and decodes with
    `tokenizers` even where tiktoken and the byte table could; joined_tokenizing (the default) encodes a
    request's texts in one tiktoken call, False one call a text (text/fast_bpe.py, text/byte_decoder.py;
    the same ids and texts every way). catalogue: the catalogue directory a constrained beam artifact
    serves (runtime/catalogue.py; given to any other artifact it is refused; a constrained engine
    without one refuses requests until `set_catalogue`)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArtifactError(f"an artifact is a directory path (str or Path), got {type(path).__name__}")
    root = Path(path)
    manifest = read_manifest(root)
    if verify_files:
        verify_artifact_files(root, manifest)
    device = _check_device(manifest)
    check_versions(manifest, {"torch": torch.__version__, "cuda": torch.version.cuda})
    _check_libstdcxx(libstdcxx_check)
    compiled, spec = manifest.compile, manifest.program
    if task_of(spec).constrained(spec) and spec.trie_layout != TRIE_LAYOUT:
        raise ArtifactError(f"artifact {manifest.name} was built by a boundgen whose constrained programs take one "
                            "allow-list a call (reach and ends [M]); this one gives each request of a call its own: "
                            "rebuild it with `boundgen build ... --task beam --constrained`")
    runtime = settings_in_effect(manifest.runtime.replace(**runtime), spec, str(device))
    tokenizer = Tokenizer.from_dir(root, fast=fast_tokenizer, joined=joined_tokenizing)
    try:
        runner = load_runner(root, compiled.packages, compiled.weights_file, device, task_of(spec).steps(spec),
                             runtime, compiled.ops_to_register)
    except (RuntimeError, KeyError) as exc:
        raise ArtifactError(f"could not load the compiled package of {manifest.name}: {exc!s}") from None
    provenance = Provenance(str(root.resolve()), compiled.lowering, compiled.weights, compiled.gpu_name,
                            manifest.validation.get("passed"), __version__, tokenizer.encoder_name)
    engine = make_engine(manifest.name, spec, tokenizer, runner, str(device), compiled.dtype, runtime,
                         vocab_outputs=has_vocab_outputs(manifest.interface),  # lse, label_logits (artifact/tensors.py)
                         fp8_groups=[] if compiled.fp8 == "none" else compiled.fp8.split(","),  # bench/mfu.py groups
                         provenance=provenance)
    if catalogue is not None:
        try:
            engine.load_catalogue(catalogue)
        except BaseException:
            engine.close()  # its batch threads started with it: a failed load leaves nothing running
            raise
    return engine


def _check_device(manifest: Manifest) -> torch.device:
    compiled = manifest.compile
    device = torch.device(compiled.device)
    if device.type != "cuda":
        return device
    built_on = f"{compiled.gpu_name} (compute capability {compiled.gpu_capability})"
    if not torch.cuda.is_available():
        raise ArtifactError(f"artifact {manifest.name} was built for {device} on {built_on}, "
                            "but this process sees no CUDA device")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ArtifactError(f"artifact {manifest.name} was built for {device}; this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s)")
    here = ".".join(map(str, torch.cuda.get_device_capability(device)))
    if compiled.gpu_capability and here != compiled.gpu_capability:
        raise ArtifactError(f"artifact {manifest.name} was compiled for {built_on}; this GPU "
                            f"({torch.cuda.get_device_name(device)}) has compute capability {here}: rebuild it here")
    return device


def _check_libstdcxx(mode: str) -> None:
    if mode == "skip":
        return
    if mode not in ("auto", "require"):
        raise ConfigError(f"libstdcxx_check must be auto, require or skip, got {mode!r}")
    if mode == "require" and libstdcxx.is_preloaded():
        return
    lib = libstdcxx.missing_preload() if mode == "auto" else (libstdcxx.system_libstdcxx() or "libstdc++.so.6")
    if lib is not None:
        raise ArtifactError(libstdcxx.missing_preload_message(lib))
