"""What a program is built for: the task, its fixed parameters and its shape bounds.

One frozen dataclass per task, checked at construction. Everything else derives from them:
`boundgen build` flags and deploy-file keys (`options`), the manifest's "program" section
(`spec_to_dict` / `spec_from_dict`), the runtime's buffer sizes (`call_max_tokens`,
`call_max_samples`) and the server's model metadata and input checks. A new bound is one
field here (with its `option(...)` metadata) plus its use.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields

from boundgen.errors import ConfigError

MAX_WIDTH = 400
MAX_STEPS = 5
# |length_penalty| bound: a step's divisor, generated ** length_penalty, stays a normal FP32 number
# (5 ** 50 = 8.9e34, 5 ** -50 = 1.1e-35); HF's own values are a few units.
MAX_LENGTH_PENALTY = 50


def option(default, help: str, key: str | None = None, required: bool = False, kind=None):
    """A field that users set (a `boundgen build` flag and a deploy-file key).
    key: the flag / deploy-file name when it differs from the field's; kind: the value type
    (int, float, str, "list[str]", "list[int]") when the annotation does not say it plainly."""
    return field(default=default, metadata={"help": help, "key": key, "required": required, "kind": kind})


@dataclass(frozen=True)
class Option:
    """One user-facing field of a spec: its flag / deploy-file key and how to read it."""

    field: str
    key: str
    kind: object  # int | float | str | "list[str]" | "list[int]"
    default: object
    help: str
    required: bool


def options(cls) -> list[Option]:
    """The user-facing fields of a spec class, in declaration order."""
    out = []
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        kind = f.metadata["kind"] or {"int": int, "float": float, "str": str}.get(str(f.type).split(" |")[0], str)
        default = None if f.default is MISSING else f.default
        out.append(Option(f.name, f.metadata["key"] or f.name, kind, default, f.metadata["help"],
                          f.metadata["required"]))
    return out


@dataclass(frozen=True)
class ScoreSpec:
    labels: tuple[str, ...] = option((), 'label texts, each one token (" yes" " no")', kind="list[str]")
    label_token_ids: tuple[int, ...] = ()  # derived from labels by the tokenizer at build
    head_path: str | None = option(None, "MLP head safetensors file instead of labels", key="head", kind=str)
    topk: int = option(0, "also return the top-k next tokens over the vocabulary")
    # 16 (a W1 request holds 15): a CPU build's validation holds [N_q, T, T] scores of the
    # compiled attention (compile/memory.py), so 64 x 512 tokens does not fit 24 GiB.
    max_samples: int = option(16, "samples per request")
    max_tokens_per_sample: int = option(512, "tokens per sample")
    max_total_tokens: int | None = option(None, "tokens per request (default max-samples x max-tokens-per-sample)",
                                          kind=int)
    template: str = option("{text}", "prompt template with a {text} placeholder")
    task: str = field(default="score", init=False)

    def __post_init__(self):
        if self.max_total_tokens is None:
            _positive(self, "max_samples", "max_tokens_per_sample")
            object.__setattr__(self, "max_total_tokens", self.max_samples * self.max_tokens_per_sample)
        _positive(self, "max_samples", "max_tokens_per_sample", "max_total_tokens")
        if not self.labels and not self.head_path:
            raise ConfigError("a score model needs --labels (label texts) or an MLP head file")
        if len(self.labels) != len(self.label_token_ids):
            raise ConfigError("labels and label_token_ids differ in length")
        if len(set(self.label_token_ids)) != len(self.label_token_ids):
            raise ConfigError(f"labels {list(self.labels)} map to repeated token ids {list(self.label_token_ids)}")
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 0:
            raise ConfigError(f"topk must be an integer >= 0, got {self.topk!r}")
        if self.max_tokens_per_sample > self.max_total_tokens:
            raise ConfigError(f"max_tokens_per_sample ({self.max_tokens_per_sample}) exceeds "
                              f"max_total_tokens ({self.max_total_tokens})")
        _template(self.template)

    # A score call's bounds are the request bounds: the engine batches requests within them.
    @property
    def call_max_tokens(self) -> int:
        return self.max_total_tokens

    @property
    def call_max_samples(self) -> int:
        return self.max_samples

    def describe(self) -> str:
        return f"{self.max_samples} samples x {self.max_tokens_per_sample} tokens, {self.max_total_tokens} in all"


@dataclass(frozen=True)
class BeamSpec:
    width: int = option(100, f"beam width W, 1..{MAX_WIDTH}", required=True)
    steps: int = option(5, f"tokens to generate N, 1..{MAX_STEPS}", required=True)
    stop_token_ids: tuple[int, ...] = option((), "stop token ids (default: generation_config.json eos_token_id)",
                                             kind="list[int]")
    length_penalty: float = option(0.0, "HF length_penalty")
    min_new_tokens: int = option(0, "suppress stop tokens before this many tokens")
    max_prompt_tokens: int = option(1024, "prompt token bound")
    template: str = option("{text}", "prompt template with a {text} placeholder")
    max_requests: int = option(1, "prompts one compiled call may hold: concurrent requests batched")
    constrained: bool = option(False, "restrict candidates to a catalogue's items, the catalogue given at serve "
                                      "time (boundgen serve --catalogue NAME=CAT_DIR)", kind=bool)
    # A bound, not the catalogue: the trie's arrays are program inputs of any size; a node's
    # children are looked up in this many slots (the root's in V), so deeper nodes of a
    # catalogue served with the artifact may have at most this many children each.
    catalogue_max_degree: int = option(4096, "constrained: the most children a trie node below the root may have")
    # How a constrained program takes the allow-lists (artifact/tensors.py TRIE_LAYOUT): "rows",
    # one per request of a call; "shared", one for the call (manifests written before the rows).
    trie_layout: str = "rows"
    task: str = field(default="beam", init=False)

    def __post_init__(self):
        if isinstance(self.width, bool) or not isinstance(self.width, int) or not 1 <= self.width <= MAX_WIDTH:
            raise ConfigError(f"beam width must be an integer in [1, {MAX_WIDTH}], got {self.width}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"beam steps (tokens to generate) must be an integer in [1, {MAX_STEPS}], got {self.steps}")
        if not isinstance(self.min_new_tokens, int) or not 0 <= self.min_new_tokens <= self.steps:
            raise ConfigError(f"min_new_tokens must be in [0, steps={self.steps}], got {self.min_new_tokens}")
        _positive(self, "max_prompt_tokens", "max_requests", "catalogue_max_degree")
        if not isinstance(self.constrained, bool):
            raise ConfigError(f"constrained must be true or false, got {self.constrained!r}")
        if not self.constrained and self.catalogue_max_degree != BeamSpec.catalogue_max_degree:
            raise ConfigError("catalogue_max_degree bounds a constrained program's trie: it needs constrained "
                              "(--constrained)")
        if not (isinstance(self.length_penalty, (int, float)) and not isinstance(self.length_penalty, bool)
                and math.isfinite(self.length_penalty) and abs(self.length_penalty) <= MAX_LENGTH_PENALTY):
            raise ConfigError(f"length_penalty must be a number in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}], "
                              f"got {self.length_penalty!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be token ids (integers >= 0), got {list(self.stop_token_ids)}")
        _template(self.template)

    @property
    def call_max_tokens(self) -> int:
        """Prompt tokens one program call may hold (all its requests)."""
        return self.max_prompt_tokens * self.max_requests

    @property
    def call_max_samples(self) -> int:
        return self.max_requests

    # A beam request is one prompt: its bounds in the score spec's terms.
    @property
    def max_samples(self) -> int:
        return 1

    @property
    def max_tokens_per_sample(self) -> int:
        return self.max_prompt_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.max_prompt_tokens

    def describe(self) -> str:
        return (f"W={self.width} N={self.steps}, prompt <= {self.max_prompt_tokens} tokens, "
                f"<= {self.max_requests} per call")


SPECS = {"score": ScoreSpec, "beam": BeamSpec}


def _positive(spec, *names):
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _template(template: str) -> None:
    """text/template.py's checks (artifact/ and text/ are leaves: neither imports the other)."""
    if not isinstance(template, str) or "{text}" not in template:
        raise ConfigError(f"template {template!r} has no {{text}} placeholder")
    if not template.isascii():  # a command line's bytes that were not UTF-8 (lone surrogates)
        try:
            template.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"template {template!r} is not valid UTF-8 text: it holds a lone surrogate "
                              f"at character {exc.start}") from None


def spec_to_dict(spec) -> dict:
    out = asdict(spec)
    if out.get("constrained") is False:
        out.pop("trie_layout", None)  # a plain search takes no trie
    return out


def spec_from_dict(raw: dict):
    """A spec from its dict form (the manifest's "program" section, model metadata)."""
    raw = dict(raw)
    task = raw.pop("task", None)
    cls = SPECS.get(task)
    if cls is None:
        raise ConfigError(f"unknown task {task!r}; expected score or beam")
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown {task} options: {', '.join(unknown)}")
    if "trie_layout" in names and raw.get("constrained"):
        raw.setdefault("trie_layout", "shared")  # written before the field: reach and ends were [M]
    for key in ("labels", "label_token_ids", "stop_token_ids"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return cls(**raw)
