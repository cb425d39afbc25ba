"""`boundgen score`: label probabilities for samples, from a model directory or a built artifact."""

from __future__ import annotations

from boundgen.cli.common import (add_precision_args, check_device, check_model_path, check_task, is_artifact,
                                 print_json, refuse_for_artifacts, resolve_dtype)
from boundgen.errors import ConfigError, InvalidInput


def register(sub):
    p = sub.add_parser("score", help="score samples: softmax over label tokens at each sample's last token",
                       description="Prints JSON {\"label_token_ids\": [...], \"scores\": [[p, ...], ...]}.")
    p.add_argument("model", metavar="MODEL_DIR", help="HF model directory or boundgen artifact directory")
    p.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                   help='label texts, each exactly one token (e.g. " yes" " no")')
    p.add_argument("--text", action="append", default=[], metavar="T", help="a sample (repeat for more)")
    p.add_argument("--max-tokens", type=int, default=1024, help="token limit per sample (default 1024)")
    p.add_argument("--template", default="{text}", help="prompt template with a {text} placeholder")
    p.add_argument("--topk", type=int, default=0, help="also return the top-k next tokens over the vocabulary")
    p.add_argument("--head", default=None, metavar="FILE", help="MLP head safetensors file instead of labels")
    add_precision_args(p)
    p.set_defaults(run=run, eager_defaults={dest: p.get_default(dest) for dest in EAGER_ONLY})


# Flags of a run on a model directory: an artifact fixed them when it was built
EAGER_ONLY = ("max_tokens", "template", "topk", "head", "dtype", "device")


def run(args):
    check_model_path(args.model)
    if not args.text:
        raise InvalidInput("no samples given: pass at least one --text")
    if is_artifact(args.model):
        import boundgen

        refuse_for_artifacts(args, args.eager_defaults, args.model)
        engine = boundgen.load(args.model)
        check_task(engine, args.model, "score")
        if args.labels is not None and tuple(args.labels) != tuple(engine.spec.program.labels):
            raise ConfigError(f"artifact {args.model} was built for labels {list(engine.spec.program.labels)}, "
                              f"not {args.labels}")
    else:
        engine = _eager(args)
    result = engine.score(args.text)
    out = {"label_token_ids": result.label_token_ids, "scores": result.scores.tolist()}
    if result.topk_ids is not None:
        out["topk_ids"], out["topk_probs"] = result.topk_ids.tolist(), result.topk_probs.tolist()
    print_json(out)


def _eager(args):
    from boundgen.artifact.program import ScoreSpec
    from boundgen.compile.memory import check_eager_fits
    from boundgen.programs.eager import eager_engine
    from boundgen.text.tokenizer import Tokenizer

    if not args.labels and not args.head:
        raise ConfigError("pass --labels (label texts, each one token) or --head FILE")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be positive, got {args.max_tokens}")
    check_device(args.device)
    labels = tuple(args.labels or ())
    ids = Tokenizer.from_dir(args.model).label_token_ids(labels)
    n = len(args.text)
    spec = ScoreSpec(labels=labels, label_token_ids=ids, head_path=args.head, topk=args.topk, max_samples=n,
                     max_tokens_per_sample=args.max_tokens, max_total_tokens=n * args.max_tokens,
                     template=args.template)
    check_eager_fits(args.model, spec, resolve_dtype(args), args.device)
    return eager_engine(args.model, spec, resolve_dtype(args), args.device)
