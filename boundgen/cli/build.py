"""`boundgen build MODEL_DIR --task {score,beam} --out ARTIFACT_DIR`: compile a validated artifact.

Options come from a deploy file (`--config`, JSON; compile/config.py documents its keys) and
from flags; a flag given wins over the file. The program and runtime flags are derived from
the dataclasses that define them (artifact/program.py, artifact/manifest.py). Progress goes to
stderr; the last stdout line is a JSON summary (artifact path, size, seconds per stage,
validation result).
"""

from __future__ import annotations

import signal
from pathlib import Path

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec, ScoreSpec, options
from boundgen.cli.common import parse_id_list, print_json

GROUPS = (("score", ScoreSpec), ("beam", BeamSpec), ("runtime (recorded in the manifest)", RuntimeConfig))
COMPILE_FLAGS = ("name", "task", "device", "dtype", "fp8", "weights")


def register(sub):
    p = sub.add_parser("build", help="compile a model into a deployable, validated artifact directory",
                       description="Export the score or beam program with bounded shapes, compile it with "
                                   "AOTInductor, validate it against the eager reference and write ARTIFACT_DIR "
                                   "(manifest.json, compiled package, weights, tokenizer).")
    p.add_argument("model", metavar="MODEL_DIR", help="HF model directory (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--out", required=True, metavar="ARTIFACT_DIR",
                   help="artifact directory to write: a new or empty one (the artifact is assembled beside it and "
                        "renamed into place once validated)")
    p.add_argument("--force", action="store_true",
                   help="replace an artifact already in ARTIFACT_DIR (only once the new one is complete)")
    p.add_argument("--config", default=None, metavar="DEPLOY_FILE", help="deploy file (JSON); flags override it")
    p.add_argument("--task", choices=["score", "beam"], default=None, help="program to build")
    p.add_argument("--name", default=None, help="model name served (default: the ARTIFACT_DIR name)")
    p.add_argument("--device", default=None, help="target device: cpu or cuda (default cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="compute dtype (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--lowering", action="append", default=None, metavar="OP=IMPL",
                   help="op implementation, e.g. packed_attention=triton (repeatable; default: every op's torch "
                        "reference, no fused ops; docs/build.md lists the ops and their lowerings)")
    p.add_argument("--fp8", choices=["none", "mlp", "mlp,attn"], default=None, metavar="MODE",  # fp8.MODES
                   help="none, mlp or mlp,attn. mlp: the MLP's gate/up and down projections in FP8 E4M3 "
                        "(per-channel weight scales, per-token activation scales; bf16 builds; validated against "
                        "the FP32 program); mlp,attn: the attention's qkv and output projections too (default none)")
    p.add_argument("--weights", choices=["external", "packaged"], default=None,
                   help="weights as safetensors beside the package (default) or inside it")
    shared = {o.key for o in options(ScoreSpec)} & {o.key for o in options(BeamSpec)}
    group = p.add_argument_group("score and beam")
    for opt in options(ScoreSpec):
        if opt.key in shared:
            _add_flag(group, opt)
    for title, cls in GROUPS:
        group = p.add_argument_group(title)
        for opt in options(cls):
            if opt.key not in shared:
                _add_flag(group, opt)
    p.add_argument("--sign-key", default=None, metavar="KEY",
                   help="Ed25519 private key (PEM, `boundgen keygen`) to sign the artifact's manifest with "
                        "(manifest.sig); `boundgen serve --trust-key` then refuses unsigned or altered artifacts")
    p.set_defaults(run=run)


def _add_flag(group, opt) -> None:
    flag = "--" + opt.key.replace("_", "-")
    default = "" if opt.default in (None, (), False) or opt.required else f" (default {opt.default})"
    if opt.kind is bool:
        group.add_argument(flag, dest=opt.key, action="store_true", default=None, help=opt.help)
    elif opt.kind == "list[str]":
        group.add_argument(flag, dest=opt.key, nargs="+", default=None, metavar=opt.key.upper()[:-1], help=opt.help)
    elif opt.kind == "list[int]":  # comma-separated ids, or 'none'
        group.add_argument(flag, dest=opt.key, default=None, metavar="IDS", help=opt.help + "; comma-separated, or 'none'")
    else:
        group.add_argument(flag, dest=opt.key, type=opt.kind, default=None, help=opt.help + default)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # the build's cleanup runs (compile/pipeline.py), then `interrupted`, exit 130


def run(args):
    from boundgen.compile import config  # lazy: `boundgen --help` must not import torch and the compiler
    from boundgen.compile.pipeline import build

    sign_key = None
    if args.sign_key is not None:  # read before building: a bad key must not cost a build
        from boundgen.artifact import signing  # lazy: `cryptography` is needed only to sign

        sign_key = signing.load_private_key(args.sign_key)
    options_, base_dir = config.read_deploy_file(args.config)
    flags = {name: getattr(args, name) for name in COMPILE_FLAGS}
    for _, cls in GROUPS:
        for opt in options(cls):
            flags[opt.key] = getattr(args, opt.key)
    if flags["labels"] is not None:
        flags["labels"] = list(flags["labels"])
    if flags["head"] is not None:  # relative to the working directory (the deploy file's are relative to it)
        flags["head"] = str(Path(flags["head"]).resolve())
    if flags["stop_token_ids"] is not None:
        flags["stop_token_ids"] = list(parse_id_list(flags["stop_token_ids"]))
    if args.lowering is not None:
        flags["lowering"] = {**options_.get("lowering", {}), **config.parse_lowering_flags(args.lowering)}
    options_.update({k: v for k, v in flags.items() if v is not None})
    cfg = config.resolve(args.model, args.out, options_, base_dir)
    signal.signal(signal.SIGTERM, _terminated)  # as Ctrl-C: the half-built artifact's folder is removed
    written = build(cfg, force=args.force)
    if sign_key is not None:
        signing.sign(cfg.out, sign_key)
    size = sum(p.stat().st_size for p in cfg.out.rglob("*") if p.is_file())
    print_json({"artifact": str(cfg.out), "name": written.name, "task": written.task, "bytes": size,
                "seconds": written.compile.seconds, "validation_passed": written.validation["passed"]})
