"""`manifest.json`, the artifact's deployment descriptor: a typed, versioned record.

The compiler writes a `Manifest` (compile/pipeline.py); the runtime reads it back by attribute
(runtime/loading.py). Plain Python, no torch: versions of this process are passed in.

Schema "boundgen.artifact/3", top-level keys:
- schema, name, task, created (UTC ISO time), model {source, family, config}
- program: the spec (artifact/program.py; an MLP head path is relative to the artifact)
- interface: tensors (the program's I/O: dtype and shape, dims by name), dims ({name: [min, max]})
- runtime: RuntimeConfig (below; every engine knob is one of its fields): defaults that
  `boundgen serve`, `boundgen bench` and `boundgen.load` may override without a rebuild
- compile: CompileRecord (device, dtype, lowering, weights, packages, weights file, GPU, seconds)
- validation: the build's validation report (compile/validate.py)
- versions: boundgen, torch, triton, cuda, python at build time
- files: {relative path: sha256} for every file of the artifact but manifest.json
- manifest_sha256: sha256 of this JSON without that key (sorted keys, compact), so that an
  edited manifest is caught like an edited weight file.
/2 (before this schema) recorded the runtime DAG's topology; it is refused with a message
naming its version.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from boundgen.artifact.program import SPECS, option, spec_from_dict, spec_to_dict
from boundgen.errors import ArtifactError, ConfigError

# A model's name, as `boundgen build --name` takes it and the repository route finds it: it is part of every URL
MODEL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")

SCHEMA = "boundgen.artifact/3"
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"  # written by artifact/signing.py, beside the manifest it signs


MAX_BATCH_WAIT_MS = 20.0  # the mean latency budget: waiting longer for company never pays


@dataclass(frozen=True)
class RuntimeConfig:
    """How an artifact is served; recorded at build, overridable at load (no recompilation)."""

    contexts: int = option(1, "request contexts preallocated at load (calls in flight at once)")
    executors: int = option(1, "model calls that may run at once")
    cuda_graphs: bool = option(False, "replay CUDA graphs per shape bucket", kind=bool)
    batching: bool = option(False, "concurrent requests share model calls", kind=bool)
    token_bucket: int = option(256, "token bucket that CUDA-graph shapes are padded to")
    batch_wait_ms: float = option(0.0, "with batching: ms after a call that a free context may wait for company "
                                       "(0: never waits; runtime/batcher.py)", kind=float)
    batch_wait_learned: bool = option(False, "with batching: wait for company as long as it took to come back after "
                                             "recent calls (the 90th percentile), never less than batch_wait_ms nor "
                                             "more than the last call took; batch_wait_ms where those delays are "
                                             "spread, as in an open loop (runtime/company.py)", kind=bool)
    catalogue_max_nodes: int = option(0, "with CUDA graphs, a constrained beam artifact: the most trie nodes of a "
                                         "catalogue it may serve, held by every request context (0: the first "
                                         "catalogue's nodes and a quarter more; runtime/context.py)")

    def __post_init__(self):
        for name in ("contexts", "executors", "token_bucket"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        nodes = self.catalogue_max_nodes
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
            raise ConfigError(f"catalogue_max_nodes must be an integer >= 0 (0: sized by the first catalogue), "
                              f"got {nodes!r}")
        wait = self.batch_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_BATCH_WAIT_MS:
            raise ConfigError(f"batch_wait_ms must be a number of ms from 0 to {MAX_BATCH_WAIT_MS}, got {wait!r}")
        for name in ("cuda_graphs", "batching", "batch_wait_learned"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def replace(self, **overrides) -> "RuntimeConfig":
        """A copy with the overrides that are not None; a name that is no field here is a ConfigError."""
        known = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(f"unknown runtime settings {', '.join(unknown)}; the settings are {', '.join(known)}")
        return RuntimeConfig(**{**asdict(self), **{k: v for k, v in overrides.items() if v is not None}})


@dataclass(frozen=True)
class CompileRecord:
    """How the packages were compiled."""

    device: str  # "cpu" | "cuda" | "cuda:N"
    dtype: str
    lowering: dict  # op -> implementation
    weights: str  # "external" | "packaged"
    packages: dict  # package name -> file
    weights_file: str | None = None
    gpu_name: str | None = None
    gpu_capability: str | None = None
    inductor_configs: dict = field(default_factory=dict)
    decompose_custom_triton_ops: bool = False
    seconds: dict = field(default_factory=dict)
    custom_ops: list | None = None  # boundgen ops the packages call by name (compile/aoti.called_ops)
    fp8: str = "none"  # projections in FP8 E4M3: "mlp" or "mlp,attn" (model/fp8.py)

    @property
    def ops_to_register(self) -> list[str]:
        """The ops a loading process registers before it loads the packages: those they call, or,
        in a manifest written before these were recorded, those lowered to other than torch."""
        if self.custom_ops is not None:
            return list(self.custom_ops)
        return [op for op, impl in self.lowering.items() if impl != "torch"]


@dataclass(frozen=True)
class Manifest:
    name: str
    created: str
    model: dict  # source, family, config
    program: object  # ScoreSpec | BeamSpec
    interface: dict  # tensors, dims
    runtime: RuntimeConfig
    compile: CompileRecord
    validation: dict
    versions: dict
    files: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.program.task

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "name": self.name, "task": self.task, "created": self.created,
                "model": self.model, "program": spec_to_dict(self.program), "interface": self.interface,
                "runtime": asdict(self.runtime), "compile": asdict(self.compile), "validation": self.validation,
                "versions": self.versions, "files": self.files}

    @classmethod
    def from_dict(cls, raw: dict, where: str = MANIFEST_FILE) -> "Manifest":
        if raw.get("schema") != SCHEMA:
            raise ArtifactError(f"{where} has manifest version {raw.get('schema')!r}; this boundgen reads {SCHEMA!r}: "
                                "rebuild the artifact with `boundgen build`")
        missing = [f.name for f in fields(cls) if f.name not in raw] + [k for k in ("task",) if k not in raw]
        if missing:
            raise ArtifactError(f"{where} lacks keys {', '.join(missing)}; rebuild the artifact")
        if not isinstance(raw["program"], dict):
            raise ArtifactError(f"{where}: program must be a JSON object; rebuild the artifact")
        try:
            program = spec_from_dict(raw["program"])
        except (ConfigError, TypeError) as exc:
            raise ArtifactError(f"{where} has an invalid program spec: {exc}; rebuild the artifact") from None
        runtime, compiled = _section(RuntimeConfig, raw["runtime"], where), _section(CompileRecord, raw["compile"], where)
        if SPECS.get(raw["task"]) is not type(program):  # the recorded task names the program's kind
            raise ArtifactError(f"{where} says task {raw['task']!r} but its program is a {program.task} program")
        for key, kind in _KINDS.items():  # an edited manifest (its self-hash redone) must not reach code as a 500
            if not isinstance(raw[key], kind):
                raise ArtifactError(f"{where}: {key} must be a JSON {_JSON_NAMES[kind]}, got {type(raw[key]).__name__}; "
                                    "rebuild the artifact")
        _check_token_ids(raw, where)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in raw["files"].items()):
            raise ArtifactError(f"{where}: files must map file names to sha256 digests; rebuild the artifact")
        return cls(name=raw["name"], created=raw["created"], model=raw["model"], program=program,
                   interface=raw["interface"], runtime=runtime, compile=compiled, validation=raw["validation"],
                   versions=raw["versions"], files=raw["files"])


def _check_token_ids(raw: dict, where: str) -> None:
    """The program's label and stop token ids: integers inside the model's vocabulary (an edited id
    outside it labelled scores with an id the model does not have)."""
    config = raw["model"].get("config")
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ArtifactError(f"{where}: model.config.vocab_size must be a positive integer; rebuild the artifact")
    for key in ("label_token_ids", "stop_token_ids"):
        ids = raw["program"].get(key, ())
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab]
        if bad:
            raise ArtifactError(f"{where}: {key} {bad[:8]} are not token ids of the model's vocabulary "
                                f"of {vocab}; rebuild the artifact")


_KINDS = {"name": str, "created": str, "model": dict, "interface": dict, "validation": dict, "versions": dict,
          "files": dict}
_JSON_NAMES = {str: "string", dict: "object"}


def _section(cls, raw, where: str):
    """A manifest section as its dataclass, or an ArtifactError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ArtifactError(f"{where}: {cls.__name__} must be a JSON object; rebuild the artifact")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in raw]
    if missing:
        raise ArtifactError(f"{where} lacks the entry {missing[0]!r}; rebuild the artifact")
    unknown = sorted(set(raw) - {f.name for f in fields(cls)})
    if unknown:
        raise ArtifactError(f"{where} has unknown entries {', '.join(unknown)}; rebuild the artifact")
    try:
        return cls(**raw)
    except ConfigError as exc:
        raise ArtifactError(f"{where} has an invalid entry: {exc}; rebuild the artifact") from None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_hashes(artifact_dir: Path) -> dict[str, str]:
    """sha256 of every file under artifact_dir except the manifest and its signature (which signs
    the manifest, artifact/signing.py), by relative POSIX path."""
    root = Path(artifact_dir)
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in (MANIFEST_FILE, SIGNATURE_FILE)}


def _self_hash(raw: dict) -> str:
    body = {k: v for k, v in raw.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(artifact_dir: Path, manifest: Manifest) -> Manifest:
    """Record every file's hash and the self hash; write manifest.json. Returns it as a loader reads it."""
    raw = dict(manifest.to_dict(), files=file_hashes(artifact_dir))
    raw["manifest_sha256"] = _self_hash(raw)
    text = json.dumps(raw, indent=2, sort_keys=True) + "\n"
    (Path(artifact_dir) / MANIFEST_FILE).write_text(text)
    return Manifest.from_dict(json.loads(text))


def read_manifest(artifact_dir: Path) -> Manifest:
    """Parse manifest.json and check its version, keys and self hash (files: `verify_files`)."""
    path = Path(artifact_dir) / MANIFEST_FILE
    if not Path(artifact_dir).is_dir():
        raise ArtifactError(f"{artifact_dir} is not a directory")
    if not path.is_file():
        raise ArtifactError(f"{artifact_dir} is not a boundgen artifact: no {MANIFEST_FILE}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); rebuild the artifact") from None
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path} must hold a JSON object")
    if raw.get("schema") == SCHEMA and raw.get("manifest_sha256") != _self_hash(raw):
        raise ArtifactError(f"{path} was modified after the build (its manifest_sha256 does not match its "
                            "contents); rebuild the artifact instead of editing it")
    return Manifest.from_dict(raw, str(path))


def verify_files(artifact_dir: Path, manifest: Manifest) -> None:
    """Every file the manifest lists exists with its recorded sha256."""
    root = Path(artifact_dir)
    if not isinstance(manifest.files, dict) or not manifest.files:
        raise ArtifactError(f"{root / MANIFEST_FILE} lists no files")
    for name, digest in sorted(manifest.files.items()):
        path = root / name
        if Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file():  # only files of the artifact
            raise ArtifactError(f"artifact file {name} listed in the manifest is missing from {root}")
        actual = sha256_file(path)
        if actual != digest:
            raise ArtifactError(f"artifact file {name} was modified or corrupted: sha256 {actual[:16]}..., "
                                f"the manifest records {digest[:16]}...")


def check_versions(manifest: Manifest, here: dict) -> None:
    """Refuse an artifact built with another torch major.minor (or CUDA major, for GPU artifacts)
    than `here` ({"torch": ..., "cuda": ...} of this process)."""
    built = manifest.versions
    problems = []
    if _major_minor(built.get("torch")) != _major_minor(here["torch"]):
        problems.append(f"torch {built.get('torch')} at build, {here['torch']} here")
    if str(manifest.compile.device).startswith("cuda") and _major(built.get("cuda")) != _major(here["cuda"]):
        problems.append(f"CUDA {built.get('cuda')} at build, {here['cuda']} here")
    if problems:
        raise ArtifactError(f"artifact {manifest.name} was built for another runtime: {'; '.join(problems)}. "
                            f"Either install the build's torch here ({install_command(built, manifest.compile.device)}) "
                            f"or rebuild the artifact with `boundgen build` on this system (torch {here['torch']}).")


def install_command(built: dict, device: str) -> str:
    """The pip command that installs the torch an artifact was built with: its version from
    PyTorch's index of the build's variant (cpu, or cuXYZ from the CUDA version at build)."""
    version = str(built.get("torch") or "?")
    release, _, local = version.partition("+")
    variant = local or ("cu" + str(built.get("cuda") or "").replace(".", "")[:3] if str(device).startswith("cuda")
                        and built.get("cuda") else "cpu")
    return f"pip install 'torch=={release}' --index-url https://download.pytorch.org/whl/{variant}"


def _major_minor(version: str | None) -> tuple:
    return tuple((version or "").split("+")[0].split(".")[:2])


def _major(version: str | None) -> str:
    return (version or "none").split(".")[0]
