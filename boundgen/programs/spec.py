"""What a program is built for: the task, its fixed parameters and its shape bounds.

A spec is decided before deployment (CLI flags or the deploy file), checked here, recorded in
the artifact manifest and read back by the runtime, which sizes its buffers from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from boundgen.errors import ConfigError

MAX_WIDTH = 400
MAX_STEPS = 5


@dataclass(frozen=True)
class ScoreSpec:
    labels: tuple[str, ...] = ()
    label_token_ids: tuple[int, ...] = ()
    head_path: str | None = None  # MLP head safetensors file, instead of labels
    topk: int = 0
    max_samples: int = 64
    max_tokens_per_sample: int = 1024
    max_total_tokens: int = 8192
    template: str = "{text}"
    task: str = field(default="score", init=False)

    def __post_init__(self):
        _positive(self, "max_samples", "max_tokens_per_sample", "max_total_tokens")
        if not self.labels and not self.head_path:
            raise ConfigError("a score model needs --labels (label texts) or an MLP head file")
        if len(self.labels) != len(self.label_token_ids):
            raise ConfigError("labels and label_token_ids differ in length")
        if len(set(self.label_token_ids)) != len(self.label_token_ids):
            raise ConfigError(f"labels {list(self.labels)} map to repeated token ids {list(self.label_token_ids)}")
        if self.topk < 0:
            raise ConfigError(f"topk must be >= 0, got {self.topk}")
        if self.max_tokens_per_sample > self.max_total_tokens:
            raise ConfigError(f"max_tokens_per_sample ({self.max_tokens_per_sample}) exceeds "
                              f"max_total_tokens ({self.max_total_tokens})")
        if "{text}" not in self.template:
            raise ConfigError(f"template {self.template!r} has no {{text}} placeholder")

    # A score call's bounds are the request bounds: the batcher packs requests within them.
    @property
    def call_max_tokens(self) -> int:
        return self.max_total_tokens

    @property
    def call_max_samples(self) -> int:
        return self.max_samples


@dataclass(frozen=True)
class BeamSpec:
    width: int = 100
    steps: int = 5
    stop_token_ids: tuple[int, ...] = ()
    length_penalty: float = 0.0
    min_new_tokens: int = 0
    max_prompt_tokens: int = 1024
    template: str = "{text}"
    max_requests: int = 1  # prompts one program call may hold (runtime batching of concurrent requests)
    task: str = field(default="beam", init=False)

    def __post_init__(self):
        if not isinstance(self.width, int) or not 1 <= self.width <= MAX_WIDTH:
            raise ConfigError(f"beam width must be an integer in [1, {MAX_WIDTH}], got {self.width}")
        if not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"beam steps (tokens to generate) must be an integer in [1, {MAX_STEPS}], got {self.steps}")
        if not 0 <= self.min_new_tokens <= self.steps:
            raise ConfigError(f"min_new_tokens must be in [0, steps={self.steps}], got {self.min_new_tokens}")
        _positive(self, "max_prompt_tokens", "max_requests")
        if "{text}" not in self.template:
            raise ConfigError(f"template {self.template!r} has no {{text}} placeholder")

    @property
    def call_max_tokens(self) -> int:
        """Prompt tokens one program call may hold (all its requests)."""
        return self.max_prompt_tokens * self.max_requests

    @property
    def call_max_samples(self) -> int:
        return self.max_requests

    @property
    def max_samples(self) -> int:
        return 1

    @property
    def max_tokens_per_sample(self) -> int:
        return self.max_prompt_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.max_prompt_tokens


def _positive(spec, *names):
    for name in names:
        value = getattr(spec, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def spec_to_dict(spec) -> dict:
    return asdict(spec)


def spec_from_dict(raw: dict):
    raw = dict(raw)
    task = raw.pop("task", None)
    cls = {"score": ScoreSpec, "beam": BeamSpec}.get(task)
    if cls is None:
        raise ConfigError(f"unknown task {task!r}; expected score or beam")
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown {task} options: {', '.join(unknown)}")
    for key in ("labels", "label_token_ids", "stop_token_ids"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return cls(**raw)
