"""Argument helpers shared by the CLI's subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from boundgen.errors import ConfigError


def add_precision_args(parser, default_dtype: str | None = None):
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=default_dtype,
                        help="compute dtype (default: float32 on cpu, bfloat16 on cuda)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")


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
    """'151645,151643' -> (151645, 151643); 'none' or '' -> ()."""
    if text.strip().lower() in ("", "none"):
        return ()
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
