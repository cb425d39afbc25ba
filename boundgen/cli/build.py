"""`boundgen build MODEL_DIR --task {score,beam} --out ARTIFACT_DIR`: compile a validated artifact.

Options come from a deploy file (`--config`, JSON; build/config.py documents its keys) and
from flags; a flag given wins over the file. Progress goes to stderr; the last stdout line is
a JSON summary (artifact path, size, seconds per stage, validation result).
"""

from __future__ import annotations

from pathlib import Path

from boundgen.cli.common import print_json
from boundgen.programs.spec import MAX_STEPS, MAX_WIDTH

# Flags whose values go into the options under the same name (argparse dest).
OPTION_FLAGS = ("name", "task", "device", "dtype", "labels", "head", "topk", "max_samples", "max_tokens_per_sample",
                "max_total_tokens", "width", "steps", "max_prompt_tokens", "length_penalty", "min_new_tokens", "max_requests",
                "template", "contexts", "executors", "token_bucket", "weights")


def register(sub):
    p = sub.add_parser("build", help="compile a model into a deployable, validated artifact directory",
                       description="Export the score or beam program with bounded shapes, compile it with "
                                   "AOTInductor, validate it against the eager reference and write ARTIFACT_DIR "
                                   "(manifest.json, compiled package, weights, tokenizer).")
    p.add_argument("model", metavar="MODEL_DIR", help="HF model directory (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--out", required=True, metavar="ARTIFACT_DIR", help="artifact directory to write")
    p.add_argument("--config", default=None, metavar="DEPLOY_FILE", help="deploy file (JSON); flags override it")
    p.add_argument("--task", choices=["score", "beam"], default=None, help="program to build")
    p.add_argument("--name", default=None, help="model name served (default: the ARTIFACT_DIR name)")
    p.add_argument("--device", default=None, help="target device: cpu or cuda (default cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="compute dtype (default: float32 on cpu, bfloat16 on cuda)")
    g = p.add_argument_group("score")
    g.add_argument("--labels", nargs="+", default=None, metavar="LABEL", help='label texts, each one token (" yes" " no")')
    g.add_argument("--head", default=None, metavar="FILE", help="MLP head safetensors file instead of labels")
    g.add_argument("--topk", type=int, default=None, help="also return the top-k next tokens")
    g.add_argument("--max-samples", type=int, default=None, help="samples per request (default 64)")
    g.add_argument("--max-tokens-per-sample", type=int, default=None, help="tokens per sample (default 512)")
    g.add_argument("--max-total-tokens", type=int, default=None,
                   help="tokens per request (default max-samples x max-tokens-per-sample)")
    g = p.add_argument_group("beam")
    g.add_argument("--width", type=int, default=None, help=f"beam width W, 1..{MAX_WIDTH}")
    g.add_argument("--steps", type=int, default=None, help=f"tokens to generate N, 1..{MAX_STEPS}")
    g.add_argument("--max-prompt-tokens", type=int, default=None, help="prompt token bound (default 1024)")
    g.add_argument("--stop-token-ids", default=None, metavar="IDS",
                   help="comma-separated stop token ids, or 'none' (default: generation_config.json eos_token_id)")
    g.add_argument("--length-penalty", type=float, default=None, help="HF length_penalty (default 0.0)")
    g.add_argument("--min-new-tokens", type=int, default=None, help="suppress stop tokens before this many tokens")
    g.add_argument("--max-requests", type=int, default=None,
                   help="prompts one compiled call may hold: concurrent requests batched (default 1)")
    g = p.add_argument_group("compile and runtime")
    g.add_argument("--template", default=None, help="prompt template with a {text} placeholder")
    g.add_argument("--lowering", action="append", default=None, metavar="OP=IMPL",
                   help="op implementation, e.g. packed_attention=triton (repeatable; default torch)")
    g.add_argument("--weights", choices=["external", "packaged"], default=None,
                   help="weights as safetensors beside the package (default) or inside it")
    g.add_argument("--contexts", type=int, default=None, help="request contexts preallocated at load (default 1)")
    g.add_argument("--executors", type=int, default=None, help="model calls that may run at once (default 1)")
    g.add_argument("--cuda-graphs", action="store_true", default=None, help="replay CUDA graphs per shape bucket")
    g.add_argument("--batching", action="store_true", default=None,
                   help="concurrent requests share model calls (recorded in the manifest; `serve` uses it)")
    g.add_argument("--token-bucket", type=int, default=None, help="score token bucket for CUDA graphs (default 256)")
    p.add_argument("--sign-key", default=None, metavar="KEY",
                   help="Ed25519 private key (PEM, `boundgen keygen`) to sign the artifact's manifest with "
                        "(manifest.sig); `boundgen serve --trust-key` then refuses unsigned or altered artifacts")
    p.set_defaults(run=run)


def run(args):
    from boundgen.build import config
    from boundgen.build.pipeline import build
    from boundgen.cli.common import parse_id_list

    sign_key = None
    if args.sign_key is not None:  # read before building: a bad key must not cost a build
        from boundgen.artifact.signing import load_private_key

        sign_key = load_private_key(args.sign_key)
    options, base_dir = config.read_deploy_file(args.config)
    flags = {name: getattr(args, name) for name in OPTION_FLAGS}
    if args.labels is not None:
        flags["labels"] = list(args.labels)
    if args.head is not None:  # relative to the working directory (the deploy file's are relative to it)
        flags["head"] = str(Path(args.head).resolve())
    if args.stop_token_ids is not None:
        flags["stop_token_ids"] = list(parse_id_list(args.stop_token_ids))
    if args.lowering is not None:
        flags["lowering"] = {**options.get("lowering", {}), **config.parse_lowering_flags(args.lowering)}
    flags["cuda_graphs"] = args.cuda_graphs
    flags["batching"] = args.batching
    options.update({k: v for k, v in flags.items() if v is not None})
    cfg = config.resolve(args.model, args.out, options, base_dir)
    written = build(cfg)
    if sign_key is not None:
        from boundgen.artifact.signing import sign

        sign(cfg.out, sign_key)
    size = sum(p.stat().st_size for p in cfg.out.rglob("*") if p.is_file())
    print_json({"artifact": str(cfg.out), "name": written["name"], "task": written["task"], "bytes": size,
                "seconds": written["compile"]["seconds"], "validation_passed": written["validation"]["passed"]})
