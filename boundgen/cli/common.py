"""Argument helpers shared by the CLI's subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from boundgen.errors import ConfigError


DTYPES = ("float32", "bfloat16", "float16")  # the compute dtypes a command takes


def add_precision_args(parser, default_dtype: str | None = None):
    parser.add_argument("--dtype", choices=DTYPES, default=default_dtype,
                        help="compute dtype (default: float32 on cpu, bfloat16 on cuda)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")


def check_device(device: str) -> None:
    """cpu, cuda or cuda:N, else a ConfigError (torch's own error lists every device type it knows)."""
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {device!r}")


def refuse_for_artifacts(args, defaults: dict, path: str) -> None:
    """Flags of an eager run (`defaults`: dest -> default) given with an artifact, which fixed them at build:
    a ConfigError naming them, not a run that silently ignores them."""
    given = [f"--{dest.replace('_', '-')}" for dest, default in defaults.items() if getattr(args, dest) != default]
    if given:
        raise ConfigError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to artifact {path}: "
                          "it was fixed when the artifact was built (`boundgen build`); leave "
                          f"{'it' if len(given) == 1 else 'them'} out, or run on the model directory")


def check_task(engine, path: str, command: str) -> None:
    """An artifact of the task `command` runs (each task's command bears its name), else a ConfigError
    naming the command to use."""
    from boundgen.artifact.tasks import task_named, task_of

    built = task_of(engine.spec.program)
    if built is not task_named(command):
        raise ConfigError(f"artifact {path} is a {built.name} artifact: use `boundgen {built.name}`")


def resolve_dtype(args) -> str:
    return args.dtype or ("bfloat16" if str(args.device).startswith("cuda") else "float32")


def is_artifact(path: str) -> bool:
    return (Path(path) / "manifest.json").is_file()


def check_model_path(path: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{path} is not a directory (expected an HF model directory or a boundgen artifact)")
    if not is_artifact(path) and not (p / "config.json").is_file():
        raise ConfigError(f"{path} has neither manifest.json (artifact) nor config.json (HF model directory)")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def parse_id_list(text: str) -> tuple[int, ...]:
    """'151645,151643' -> (151645, 151643); 'none' -> (). An empty text is an error, not (): an unset
    shell variable (`--stop-token-ids "$STOPS"`) would otherwise drop the stop tokens without a word."""
    if text.strip().lower() == "none":
        return ()
    if not text.strip():
        raise ConfigError("expected a comma-separated list of token ids, or none, got an empty text")
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ConfigError(f"expected a comma-separated list of token ids, got {text!r}") from None


def wait_ms(text: str) -> float:
    """--batch-wait-ms: a number of ms from 0 to MAX_BATCH_WAIT_MS."""
    from boundgen.artifact.manifest import MAX_BATCH_WAIT_MS

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_BATCH_WAIT_MS:
        raise argparse.ArgumentTypeError(f"expected a number of ms from 0 to {MAX_BATCH_WAIT_MS:g}, got {text!r}")
    return value


def add_runtime_flags(parser, title: str) -> None:
    """One override flag per RuntimeConfig field (artifact/manifest.py), default None (as built):
    `serve` and `bench` take the same knobs `build` records, generated from the same dataclass."""
    from boundgen.artifact.manifest import RuntimeConfig
    from boundgen.artifact.program import options

    group = parser.add_argument_group(title)
    for opt in options(RuntimeConfig):
        flag = "--" + opt.key.replace("_", "-")
        if opt.kind is bool:
            group.add_argument(flag, dest=opt.field, action=argparse.BooleanOptionalAction, default=None,
                               help=opt.help)
        else:
            group.add_argument(flag, dest=opt.field, type=_runtime_value(opt), default=None,
                               metavar="MS" if opt.kind is float else "N", help=opt.help)


def runtime_overrides(args) -> dict:
    """The RuntimeConfig fields given on the command line (add_runtime_flags), as `boundgen.load` keywords."""
    from boundgen.artifact.manifest import RuntimeConfig
    from boundgen.artifact.program import options

    return {o.field: getattr(args, o.field) for o in options(RuntimeConfig) if getattr(args, o.field, None) is not None}


def _runtime_value(opt):
    """An argparse type that reads a RuntimeConfig field and checks it with RuntimeConfig's own rules."""
    from boundgen.artifact.manifest import RuntimeConfig

    def parse(text: str):
        try:
            value = opt.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a number' if opt.kind is float else 'an integer'}, "
                                             f"got {text!r}") from None
        try:
            RuntimeConfig().replace(**{opt.field: value})
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = opt.key
    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value
