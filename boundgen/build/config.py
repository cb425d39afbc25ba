"""What to build: a deploy file (JSON) merged with CLI flags, checked once, before any work.

Deploy file: one JSON object; every key optional, a CLI flag given on the command line wins.
Keys are the CLI flags' long names with `_` for `-`:

    {"name": "w1", "task": "score", "device": "cuda", "dtype": "bfloat16",
     "labels": [" yes", " no"],            # score: label texts, each one token ...
     "head": "head.safetensors",           # ... or an MLP head file (relative to the deploy file)
     "topk": 0, "max_samples": 15, "max_tokens_per_sample": 256, "max_total_tokens": 3840,
     "width": 100, "steps": 5, "max_prompt_tokens": 512,      # beam
     "max_requests": 8,                    # beam: prompts one call may hold (batching concurrent requests)
     "stop_token_ids": [151643], "length_penalty": 0.0, "min_new_tokens": 0,
     "template": "{text}",
     "lowering": {"packed_attention": "triton"},
     "contexts": 2, "executors": 1,        # runtime concurrency, recorded in the manifest
     "cuda_graphs": false, "token_bucket": 256,   # runtime: CUDA graphs per bucket (runtime/graphs.py)
     "batching": false,                    # runtime: concurrent requests share model calls (runtime/batched.py)
     "weights": "external",                # "external" (safetensors beside the package) | "packaged"
     "tolerances": {"probs": 2e-2}}        # per-output max abs error allowed by validation; bf16/fp16 beams
                                           # also "recall", "spearman", "top1" minimums (build/validate.py)

Defaults: dtype float32 on cpu, bfloat16 on cuda; max_total_tokens = max_samples x
max_tokens_per_sample; stop tokens from the checkpoint's generation_config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from boundgen.errors import ConfigError, InvalidInput
from boundgen.ops.lowering import OpLowering
from boundgen.programs.spec import BeamSpec, ScoreSpec

SCORE_KEYS = ("labels", "head", "topk", "max_samples", "max_tokens_per_sample", "max_total_tokens")
BEAM_KEYS = ("width", "steps", "max_prompt_tokens", "stop_token_ids", "length_penalty", "min_new_tokens",
             "max_requests")
COMMON_KEYS = ("name", "task", "device", "dtype", "template", "lowering", "contexts", "executors", "cuda_graphs",
               "batching", "token_bucket", "weights", "tolerances")
KNOWN_KEYS = frozenset(SCORE_KEYS + BEAM_KEYS + COMMON_KEYS)
WEIGHT_MODES = ("external", "packaged")
# Measured on CPU (docs/build.md): external safetensors load faster than weights inside the .so.
DEFAULT_WEIGHTS = "external"


@dataclass(frozen=True)
class BuildConfig:
    model_dir: Path
    out: Path
    name: str
    device: str  # "cpu" | "cuda" | "cuda:N"
    dtype: str  # "float32" | "bfloat16" | "float16"
    spec: ScoreSpec | BeamSpec
    lowering: OpLowering = field(default_factory=OpLowering)
    contexts: int = 1
    executors: int = 1
    cuda_graphs: bool = False
    batching: bool = False
    token_bucket: int = 256
    weights: str = DEFAULT_WEIGHTS
    tolerances: dict = field(default_factory=dict)  # output name -> max abs error, overriding defaults

    @property
    def task(self) -> str:
        return self.spec.task

    def summary(self) -> str:
        s = self.spec
        bounds = (f"{s.max_samples} samples x {s.max_tokens_per_sample} tokens, {s.max_total_tokens} in all"
                  if s.task == "score" else f"W={s.width} N={s.steps}, prompt <= {s.max_prompt_tokens} tokens, "
                                            f"<= {s.max_requests} per call")
        return f"{self.name}: {s.task} on {self.device} in {self.dtype} ({bounds})"


def read_deploy_file(path: str | Path | None) -> tuple[dict, Path | None]:
    """The deploy file's options and its folder (relative paths in it are relative to that)."""
    if path is None:
        return {}, None
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"deploy file {path} not found")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"deploy file {path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"deploy file {path} must hold one JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"deploy file {path} has unknown keys: {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(KNOWN_KEYS))}")
    return raw, path.parent


def resolve(model_dir, out, options: dict, base_dir: Path | None = None) -> BuildConfig:
    """Options (deploy file merged with flags, None meaning "not given") -> a checked BuildConfig."""
    from boundgen.runtime.eager import default_stop_tokens, label_token_ids
    from boundgen.text.tokenizer import Tokenizer

    o = {k: v for k, v in options.items() if v is not None}
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"{model_dir} is not an HF model directory (no config.json)")
    task = o.get("task")
    if task not in ("score", "beam"):
        raise ConfigError(f"--task must be score or beam, got {task!r}")
    other = BEAM_KEYS if task == "score" else SCORE_KEYS
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
    template = o.get("template", "{text}")

    if task == "score":
        head = o.get("head")
        if head is not None and base_dir is not None and not Path(head).is_absolute():
            head = str(base_dir / head)
        if head is not None and not Path(head).is_file():
            raise ConfigError(f"MLP head file {head} not found")
        if isinstance(o.get("labels"), str):
            raise ConfigError(f"labels must be a list of label texts, got the string {o['labels']!r}")
        labels = tuple(o.get("labels") or ())
        try:
            ids = label_token_ids(Tokenizer.from_dir(model_dir), labels) if labels else ()
        except InvalidInput as exc:  # a build option, not a request
            raise ConfigError(f"--labels: {exc}") from None
        max_samples = _int(o, "max_samples", 64)
        per_sample = _int(o, "max_tokens_per_sample", 512)
        spec = ScoreSpec(labels=labels, label_token_ids=ids, head_path=head, topk=_int(o, "topk", 0),
                         max_samples=max_samples, max_tokens_per_sample=per_sample,
                         max_total_tokens=_int(o, "max_total_tokens", max_samples * per_sample), template=template)
    else:
        if "width" not in o or "steps" not in o:
            raise ConfigError("a beam build needs --width W and --steps N")
        stops = o.get("stop_token_ids")
        stops = default_stop_tokens(model_dir) if stops is None else tuple(int(t) for t in stops)
        spec = BeamSpec(width=_int(o, "width"), steps=_int(o, "steps"), stop_token_ids=stops,
                        length_penalty=float(o.get("length_penalty", 0.0)),
                        min_new_tokens=_int(o, "min_new_tokens", 0),
                        max_prompt_tokens=_int(o, "max_prompt_tokens", 1024), template=template,
                        max_requests=_int(o, "max_requests", 1))

    lowering = o.get("lowering") or {}
    if not isinstance(lowering, dict):
        raise ConfigError(f"lowering must map op names to implementations, got {lowering!r}")
    tolerances = o.get("tolerances") or {}
    if not isinstance(tolerances, dict) or not all(isinstance(v, (int, float)) for v in tolerances.values()):
        raise ConfigError(f"tolerances must map output names to numbers, got {tolerances!r}")
    cfg = BuildConfig(model_dir=model_dir, out=Path(out), name=o.get("name") or Path(out).name, device=device,
                      dtype=dtype, spec=spec, lowering=OpLowering.from_dict(lowering),
                      contexts=_int(o, "contexts", 1), executors=_int(o, "executors", 1),
                      cuda_graphs=bool(o.get("cuda_graphs", False)), batching=bool(o.get("batching", False)),
                      token_bucket=_int(o, "token_bucket", 256),
                      weights=weights,
                      tolerances={k: float(v) for k, v in tolerances.items()})
    cfg.lowering.resolve()  # every named implementation exists
    if cfg.contexts < 1 or cfg.executors < 1 or cfg.token_bucket < 1:
        raise ConfigError(f"contexts, executors and token_bucket must be >= 1, got {cfg.contexts}, "
                          f"{cfg.executors} and {cfg.token_bucket}")
    return cfg


def parse_lowering_flags(flags: list[str] | None) -> dict:
    """["packed_attention=triton", ...] -> {"packed_attention": "triton", ...}."""
    out = {}
    for flag in flags or ():
        op, sep, impl = flag.partition("=")
        if not sep or not op or not impl:
            raise ConfigError(f"--lowering takes OP=IMPL (e.g. packed_attention=triton), got {flag!r}")
        out[op.strip()] = impl.strip()
    return out


def _int(o: dict, key: str, default: int | None = None) -> int:
    value = o.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    return value
