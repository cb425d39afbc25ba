"""`boundgen beam`: fixed beam search, from a model directory or a built artifact."""

from __future__ import annotations

from boundgen.cli.common import (add_precision_args, check_device, check_model_path, check_task, is_artifact,
                                 parse_id_list, print_json, refuse_for_artifacts, resolve_dtype)
from boundgen.errors import ConfigError, InvalidInput
from boundgen.artifact.program import MAX_STEPS, MAX_WIDTH


def register(sub):
    p = sub.add_parser("beam", help="fixed beam search: W candidates of N generated tokens with scores",
                       description='Prints JSON {"candidates": [{"token_ids": [...], "text": "...", "score": s}, ...]}, '
                                   "W candidates, best first; score is the sum of FP32 log-probabilities. With "
                                   "--catalogue each candidate is an item of the catalogue and carries its item_id "
                                   "(-1 and score null where fewer than W items can be reached).")
    p.add_argument("model", metavar="MODEL_DIR", help="HF model directory or boundgen artifact directory")
    p.add_argument("--width", type=int, default=None, help=f"beam width W, 1..{MAX_WIDTH}")
    p.add_argument("--steps", type=int, default=None, help=f"tokens to generate N, 1..{MAX_STEPS}")
    p.add_argument("--text", action="append", default=None, metavar="T", help="the prompt (one)")
    p.add_argument("--max-tokens", type=int, default=1024, help="prompt token limit (default 1024)")
    p.add_argument("--template", default="{text}", help="prompt template with a {text} placeholder")
    p.add_argument("--stop-token-ids", default=None, metavar="IDS",
                   help="comma-separated stop token ids, or 'none' (default: generation_config.json eos_token_id)")
    p.add_argument("--length-penalty", type=float, default=0.0, help="HF length_penalty (default 0.0: plain sums)")
    p.add_argument("--min-new-tokens", type=int, default=0, help="suppress stop tokens before this many tokens")
    p.add_argument("--catalogue", default=None, metavar="CAT_DIR",
                   help="restrict candidates to a catalogue's items (`boundgen catalogue build`); each candidate "
                        "gets its item_id (a model directory, or an artifact built with --constrained)")
    p.add_argument("--allow-items", default=None, metavar="IDS",
                   help="comma-separated item ids: only these items of the catalogue may be candidates")
    p.add_argument("--allow-subset", default=None, metavar="NAME",
                   help="a subset registered with the catalogue (an item's \"subsets\" when it was built): only "
                        "its items may be candidates (with --allow-items: those of the ids in the subset)")
    add_precision_args(p)
    p.set_defaults(run=run, eager_defaults={dest: p.get_default(dest) for dest in EAGER_ONLY})


# Flags of a run on a model directory: an artifact fixed them when it was built
EAGER_ONLY = ("max_tokens", "template", "stop_token_ids", "length_penalty", "min_new_tokens", "dtype",
              "device")


def run(args):
    check_model_path(args.model)
    if args.text is None:
        raise InvalidInput("no prompt given: pass --text")
    if len(args.text) > 1:
        raise InvalidInput(f"one prompt a run: --text was given {len(args.text)} times")
    args.text = args.text[0]
    for flag, value in (("--allow-items", args.allow_items), ("--allow-subset", args.allow_subset)):
        if value is not None and args.catalogue is None:
            raise ConfigError(f"{flag} needs --catalogue")
    allow = None if args.allow_items is None else _item_ids(args.allow_items)
    if is_artifact(args.model):
        import boundgen

        refuse_for_artifacts(args, args.eager_defaults, args.model)
        engine = boundgen.load(args.model, catalogue=args.catalogue)
        check_task(engine, args.model, "beam")
        built_for = engine.spec.program
        for flag, value, built in (("--width", args.width, built_for.width), ("--steps", args.steps, built_for.steps)):
            if value is not None and value != built:
                raise ConfigError(f"artifact {args.model} was built with {flag} {built}, not {value}")
        if engine.constrained and args.catalogue is None:
            raise ConfigError(f"artifact {args.model} was built with --constrained: pass --catalogue CAT_DIR")
        if allow is not None or args.allow_subset is not None:  # checked as the server checks ALLOW_ITEMS
            result = engine.beam(args.text, allow_items=allow, allow_subset=args.allow_subset)
            print_json({"candidates": result.candidates()})
            return
    else:
        engine = _eager(args, allow)
    print_json({"candidates": engine.beam(args.text).candidates()})


def _eager(args, allow):
    from boundgen.artifact.program import BeamSpec
    from boundgen.compile.memory import check_eager_fits
    from boundgen.programs.eager import eager_engine
    from boundgen.model.loader import check_stop_tokens, default_stop_tokens

    if args.width is None or args.steps is None:
        raise ConfigError("pass --width W and --steps N")
    check_device(args.device)
    if args.max_tokens < 1:  # the spec's own words name its field, max_prompt_tokens
        raise ConfigError(f"--max-tokens must be positive, got {args.max_tokens}")
    stops = default_stop_tokens(args.model) if args.stop_token_ids is None else parse_id_list(args.stop_token_ids)
    spec = BeamSpec(width=args.width, steps=args.steps, stop_token_ids=stops, length_penalty=args.length_penalty,
                    min_new_tokens=args.min_new_tokens, max_prompt_tokens=args.max_tokens, template=args.template)
    check_stop_tokens(args.model, spec.stop_token_ids)
    check_eager_fits(args.model, spec, resolve_dtype(args), args.device)
    return eager_engine(args.model, spec, resolve_dtype(args), args.device, catalogue=args.catalogue,
                        allow_items=allow, allow_subset=args.allow_subset)


def _item_ids(text: str) -> tuple[int, ...]:
    """'3,7,9' -> (3, 7, 9); an empty list is an error (nothing could be generated)."""
    try:
        ids = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"--allow-items expects comma-separated item ids, got {text!r}") from None
    if not ids:
        raise ConfigError("--allow-items names no item")
    return ids
