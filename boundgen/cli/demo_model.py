"""`boundgen demo-model OUT_DIR --preset P [--seed S]`: write a seeded random HF checkpoint."""

from __future__ import annotations

import argparse
import sys

from boundgen.model.presets import PRESETS


def register(sub) -> None:
    p = sub.add_parser(
        "demo-model",
        help="write a random-weight HF checkpoint with the real Qwen vocabulary",
        description="Write an HF-format checkpoint (config.json, model.safetensors, generation_config.json, "
                    "tokenizer.json, tokenizer_config.json) with seeded random weights. Refuses to write into "
                    "a non-empty directory unless it is an earlier demo checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (created if missing)")
    p.add_argument("--preset", required=True, choices=list(PRESETS), help="model shape")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    p.set_defaults(run=run)


def run(args) -> int:
    from boundgen.model.demo import write_demo_checkpoint  # lazy: `boundgen --help` must not import torch

    # Progress lines come only for checkpoints large enough to take a while (the 0.5B/0.6B presets).
    write_demo_checkpoint(args.out_dir, args.preset, seed=args.seed, progress=_stderr)
    print(f"wrote {args.preset} demo checkpoint (seed {args.seed}) to {args.out_dir}")
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
