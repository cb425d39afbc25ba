"""What to build: a deploy file (JSON) merged with CLI flags, checked once, before any work.

Deploy file: one JSON object; every key optional, a CLI flag given on the command line wins.
Keys are the CLI flags' long names with `_` for `-`, derived from the dataclasses that define
them (`deploy_keys()`):
- the program's bounds: ScoreSpec / BeamSpec (artifact/program.py), e.g. labels, head, topk,
  max_samples, max_tokens_per_sample, max_total_tokens; width, steps, max_prompt_tokens,
  max_requests, stop_token_ids, length_penalty, min_new_tokens; template;
- runtime settings recorded in the manifest: every field of RuntimeConfig (artifact/manifest.py),
  e.g. contexts, batching;
- compilation: name, task, device, dtype, lowering ({"packed_attention": "triton"}), fp8
  ("none" | "mlp": the MLP projections in E4M3 | "mlp,attn": the attention's qkv and output
  projections too; bf16 builds only, model/fp8.py), weights
  ("external": safetensors beside the package | "packaged"), tolerances ({"probs": 2e-2}:
  per-output max abs error allowed by validation; bf16/fp16 beams also "recall", "spearman",
  "top1" minimums against the FP32 program, compile/validate.py).

    {"name": "w1", "task": "score", "device": "cuda", "dtype": "bfloat16",
     "labels": [" yes", " no"], "max_samples": 15, "max_tokens_per_sample": 256,
     "lowering": {"packed_attention": "triton"}, "contexts": 2, "cuda_graphs": true, "batching": true}

Defaults: those of the dataclasses; dtype float32 on cpu, bfloat16 on cuda; stop tokens from
the checkpoint's generation_config.json; an MLP head path relative to the deploy file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from boundgen.artifact.manifest import MODEL_NAME, RuntimeConfig
from boundgen.artifact.program import SPECS, BeamSpec, ScoreSpec, options
from boundgen.errors import ConfigError, InvalidInput
from boundgen.model import fp8
from boundgen.model.loader import check_stop_tokens, default_stop_tokens, read_json_object
from boundgen.ops.lowering import OpLowering
from boundgen.text.tokenizer import Tokenizer

COMPILE_KEYS = ("name", "task", "device", "dtype", "lowering", "fp8", "weights", "tolerances")
WEIGHT_MODES = ("external", "packaged")
# Measured on CPU (docs/build.md): external safetensors load faster than weights inside the .so.
DEFAULT_WEIGHTS = "external"


def task_keys(task: str) -> tuple[str, ...]:
    return tuple(o.key for o in options(SPECS[task]))


def deploy_keys() -> frozenset[str]:
    """Every key a deploy file may hold."""
    return frozenset(COMPILE_KEYS + task_keys("score") + task_keys("beam")
                     + tuple(o.key for o in options(RuntimeConfig)))


@dataclass(frozen=True)
class BuildConfig:
    model_dir: Path
    out: Path
    name: str
    device: str  # "cpu" | "cuda" | "cuda:N"
    dtype: str  # "float32" | "bfloat16" | "float16"
    spec: ScoreSpec | BeamSpec
    lowering: OpLowering = field(default_factory=OpLowering)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    weights: str = DEFAULT_WEIGHTS
    tolerances: dict = field(default_factory=dict)  # output name -> max abs error, overriding defaults
    fp8: str = "none"  # "mlp" | "mlp,attn": the projections in E4M3 (model/fp8.py)

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def precision(self) -> str:
        """The dtype, and the FP8 mode when there is one: "bfloat16, FP8 mlp"."""
        return self.dtype + (f", FP8 {self.fp8}" if self.fp8 != "none" else "")

    def summary(self) -> str:
        return f"{self.name}: {self.task} on {self.device} in {self.precision} ({self.spec.describe()})"


def read_deploy_file(path: str | Path | None) -> tuple[dict, Path | None]:
    """The deploy file's options and its folder (relative paths in it are relative to that)."""
    if path is None:
        return {}, None
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"deploy file {path} {'is a directory' if path.is_dir() else 'not found'}")
    raw = read_json_object(path, "deploy file", unique_keys=True)
    known = deploy_keys()
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"deploy file {path} has unknown keys: {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    return raw, path.parent


def resolve(model_dir, out, options_: dict, base_dir: Path | None = None) -> BuildConfig:
    """Options (deploy file merged with flags, None meaning "not given") -> a checked BuildConfig."""
    o = {k: v for k, v in options_.items() if v is not None}
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir} is not an HF model directory (no config.json)")
    task = o.get("task")
    if task not in SPECS:
        raise ConfigError(f"--task must be score or beam, got {task!r}")
    other = {key for name in SPECS for key in task_keys(name)} - set(task_keys(task))  # other tasks' keys
    misplaced = sorted(k for k in other if k in o)
    if misplaced:
        raise ConfigError(f"options {', '.join(misplaced)} do not apply to a {task} build")
    device = str(o.get("device", "cpu"))
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {device!r}")
    dtype = o.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    weights = o.get("weights", DEFAULT_WEIGHTS)
    if weights not in WEIGHT_MODES:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {weights!r}")
    lowering = o.get("lowering") or {}
    if not isinstance(lowering, dict):
        raise ConfigError(f"lowering must map op names to implementations, got {lowering!r}")
    tolerances = o.get("tolerances") or {}
    if not isinstance(tolerances, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   and math.isfinite(v) and v >= 0 for v in tolerances.values()):
        raise ConfigError(f"tolerances must map output names to numbers >= 0, got {tolerances!r}")
    from boundgen.compile.validate import FP8_TOLERANCES, TOLERANCES  # the names a build's validation judges

    known = set(FP8_TOLERANCES).union(*TOLERANCES.values())
    if set(tolerances) - known:
        raise ConfigError(f"tolerances has unknown names {', '.join(sorted(set(tolerances) - known))}; "
                          f"known: {', '.join(sorted(known))}")
    name = o.get("name") or Path(out).name
    if not (isinstance(name, str) and MODEL_NAME.fullmatch(name)):
        given = "--name" if o.get("name") else "the artifact directory's name (the default --name)"
        raise ConfigError(f"{given} must be letters, digits, '.', '_' and '-', not starting with '.' (it is the "
                          f"model's name in every URL), got {name!r}")
    fp8_mode = str(o.get("fp8", "none"))
    fp8.check_mode(fp8_mode, dtype)
    cfg = BuildConfig(model_dir=model_dir, out=Path(out), name=name, device=device,
                      dtype=dtype, spec=_spec(task, o, model_dir, base_dir), lowering=OpLowering.from_dict(lowering),
                      runtime=RuntimeConfig(**_values(RuntimeConfig, o)), weights=weights,
                      tolerances={k: float(v) for k, v in tolerances.items()}, fp8=fp8_mode)
    cfg.lowering.resolve()  # every named implementation exists
    for op in ("silu_quant", "add_rmsnorm_quant"):  # they quantize FP8 projections' inputs
        if fp8_mode == "none" and getattr(cfg.lowering, op) != "separate":
            raise ConfigError(f"--lowering {op}=triton quantizes an FP8 MLP's input: it needs --fp8 mlp "
                              f"(or mlp,attn)")
    if fp8_mode != "none" and cfg.lowering.swiglu_down != "separate":
        raise ConfigError(f"--fp8 {fp8_mode} and --lowering swiglu_down=triton both replace the down projection; "
                          "choose one")
    return cfg


def _spec(task: str, o: dict, model_dir: Path, base_dir: Path | None) -> ScoreSpec | BeamSpec:
    values = _values(SPECS[task], o)
    required = [o_.key for o_ in options(SPECS[task]) if o_.required]
    missing = [key for key in required if key not in o]
    if missing:
        raise ConfigError(f"a {task} build needs {' and '.join('--' + k for k in required)} "
                          f"(missing: {', '.join('--' + k for k in missing)})")
    return SPEC_BUILDERS[task](values, model_dir, base_dir)


def _beam_spec(values: dict, model_dir: Path, base_dir: Path | None) -> BeamSpec:
    if "stop_token_ids" not in values:
        values["stop_token_ids"] = default_stop_tokens(model_dir)
    spec = BeamSpec(**values)  # ids >= 0 (program.py); below the vocabulary's size:
    check_stop_tokens(model_dir, spec.stop_token_ids)
    return spec


def _score_spec(values: dict, model_dir: Path, base_dir: Path | None) -> ScoreSpec:
    head = values.get("head_path")
    if head is not None and base_dir is not None and not Path(head).is_absolute():
        head = values["head_path"] = str(base_dir / head)
    if head is not None and not Path(head).is_file():
        raise ConfigError(f"MLP head file {head} not found")
    labels = values.get("labels", ())
    try:
        ids = Tokenizer.from_dir(model_dir).label_token_ids(labels) if labels else ()
    except InvalidInput as exc:  # a build option, not a request
        raise ConfigError(f"--labels: {exc}") from None
    return ScoreSpec(label_token_ids=ids, **values)


# What a build needs beyond the given options, by task (artifact/tasks.py): the checkpoint's stop
# tokens (beam), the labels' token ids and the head file's place (score).
SPEC_BUILDERS = {"score": _score_spec, "beam": _beam_spec}


def _values(cls, o: dict) -> dict:
    """The given options of a dataclass's user-facing fields, by field name, type-checked."""
    values = {}
    for opt in options(cls):
        if opt.key not in o:
            continue
        value = o[opt.key]
        if opt.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{opt.key} must be an integer, got {value!r}")
        if opt.kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{opt.key} must be a number, got {value!r}")
        if opt.kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{opt.key} must be true or false, got {value!r}")
        if opt.kind is str and not isinstance(value, str):
            raise ConfigError(f"{opt.key} must be a string, got {value!r}")
        if opt.kind in ("list[str]", "list[int]"):
            item = str if opt.kind == "list[str]" else int
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, item) and not isinstance(v, bool) for v in value):
                raise ConfigError(f"{opt.key} must be a list of {'texts' if item is str else 'integers'}, "
                                  f"got {value!r}")
            value = tuple(value)
        values[opt.field] = float(value) if opt.kind is float else value
    return values


def parse_lowering_flags(flags: list[str] | None) -> dict:
    """["packed_attention=triton", ...] -> {"packed_attention": "triton", ...}."""
    out = {}
    for flag in flags or ():
        op, sep, impl = flag.partition("=")
        if not sep or not op or not impl:
            raise ConfigError(f"--lowering takes OP=IMPL (e.g. packed_attention=triton), got {flag!r}")
        out[op.strip()] = impl.strip()
    return out
