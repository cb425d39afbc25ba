"""`manifest.json`, the artifact's deployment descriptor: its schema, writing, reading, checking.

The build writes it (build/pipeline.py); the loader checks it (runtime/loading.py). This
module is plain Python (no torch at import) so that both sides share one definition.

Schema "boundgen.artifact/2" (/2: packages by name, beam in three stages), top-level keys:
- name, task, created (UTC ISO time), model {source, family, config}
- program: the spec (programs/spec.py `spec_to_dict`; an MLP head path is relative to the artifact)
- runtime: topology (the DAG: inputs, outputs, nodes with their tensor inputs/outputs),
  tensors (the model node's I/O: dtype and shape, dims by name), dims ({name: [min, max]}),
  request (bounds a request is checked against), device, contexts, executors, cuda_graphs, token_bucket
- compile: lowering (op -> implementation), dtype, device, gpu_name, gpu_capability, weights
  ("external" | "packaged"), packages ({name: file}), weights file name, inductor_configs,
  decompose_custom_triton_ops, seconds per stage
- validation: passed, cases [{name, shape, outputs {name: {max_abs_err, tolerance, passed}}, ...}]
- versions: boundgen, torch, triton, cuda, python
- files: {relative path: sha256} for every file of the artifact but manifest.json
- manifest_sha256: sha256 of this JSON without that key (sorted keys, compact), so that an
  edited manifest is caught like an edited weight file.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

from boundgen.errors import ArtifactError

SCHEMA = "boundgen.artifact/2"
MANIFEST_FILE = "manifest.json"
REQUIRED_KEYS = ("schema", "name", "task", "program", "runtime", "compile", "validation", "versions", "files",
                 "manifest_sha256")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_hashes(artifact_dir: Path) -> dict[str, str]:
    """sha256 of every file under artifact_dir except the manifest, by relative POSIX path."""
    root = Path(artifact_dir)
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in (MANIFEST_FILE, "manifest.sig")}  # artifact/signing.py


def _self_hash(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def versions() -> dict:
    """Versions of what the artifact depends on, in this process."""
    import torch

    import boundgen

    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    return {"boundgen": boundgen.__version__, "torch": torch.__version__, "triton": triton,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def write_manifest(artifact_dir: Path, manifest: dict) -> dict:
    """Add file hashes and the self hash; write manifest.json. Returns the written dict."""
    manifest = dict(manifest, schema=SCHEMA, files=file_hashes(artifact_dir))
    manifest["manifest_sha256"] = _self_hash(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (Path(artifact_dir) / MANIFEST_FILE).write_text(text)
    return json.loads(text)  # as a loader will read it (lists, not tuples)


def read_manifest(artifact_dir: Path) -> dict:
    """Parse and check the manifest's schema and self hash (files are checked by `verify_files`)."""
    path = Path(artifact_dir) / MANIFEST_FILE
    if not Path(artifact_dir).is_dir():
        raise ArtifactError(f"{artifact_dir} is not a directory")
    if not path.is_file():
        raise ArtifactError(f"{artifact_dir} is not a boundgen artifact: no {MANIFEST_FILE}")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); rebuild the artifact") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path} must hold a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise ArtifactError(f"{path} has schema {manifest.get('schema')!r}; this boundgen reads {SCHEMA!r}: "
                            "rebuild the artifact with this version")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ArtifactError(f"{path} lacks keys {', '.join(missing)}; rebuild the artifact")
    if manifest["manifest_sha256"] != _self_hash(manifest):
        raise ArtifactError(f"{path} was modified after the build (its manifest_sha256 does not match its "
                            "contents); rebuild the artifact instead of editing it")
    return manifest


def verify_files(artifact_dir: Path, manifest: dict) -> None:
    """Every file the manifest lists exists with its recorded sha256."""
    root = Path(artifact_dir)
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{root / MANIFEST_FILE} lists no files")
    for name, digest in sorted(files.items()):
        path = root / name
        if ".." in Path(name).parts or not path.is_file():
            raise ArtifactError(f"artifact file {name} listed in the manifest is missing from {root}")
        actual = sha256_file(path)
        if actual != digest:
            raise ArtifactError(f"artifact file {name} was modified or corrupted: sha256 {actual[:16]}..., "
                                f"the manifest records {digest[:16]}...")


def check_versions(manifest: dict) -> None:
    """Refuse an artifact built with another torch major.minor (or CUDA major, for GPU artifacts)."""
    built = manifest["versions"]
    here = versions()
    problems = []
    if _major_minor(built.get("torch")) != _major_minor(here["torch"]):
        problems.append(f"torch {built.get('torch')} at build, {here['torch']} here")
    if str(manifest["compile"].get("device", "cpu")).startswith("cuda"):
        if _major(built.get("cuda")) != _major(here["cuda"]):
            problems.append(f"CUDA {built.get('cuda')} at build, {here['cuda']} here")
    if problems:
        raise ArtifactError(f"artifact {manifest['name']} was built for another runtime: {'; '.join(problems)}. "
                            "Rebuild it with `boundgen build` on this system.")


def _major_minor(version: str | None) -> tuple:
    return tuple((version or "").split("+")[0].split(".")[:2])


def _major(version: str | None) -> str:
    return (version or "none").split(".")[0]
