"""A served model's interface, derived from its `EngineSpec` (its program's bounds,
artifact/program.py): its inputs and outputs as metadata lists them, the checks of a request's
texts, and the `EngineCall` they become. KServe tensors are kserve/inference.py's: it turns a
request's tensors into an EngineCall with these checks, and a result into output tensors; the
JSON routes build their EngineCall here from texts (`Signature.call`).

    score:  TEXT BYTES [N], 1 <= N <= max_samples  ->  SCORES FP32 [N, num_labels]
                                                       and, when asked for by name (not returned
                                                       otherwise: what clients always got stays the
                                                       default): NUM_TOKENS INT32 [N], the tokens
                                                       each sample ran (template included);
                                                       LABEL_LOGPROBS FP32 [N, num_labels], each label's
                                                       log-probability over the whole vocabulary, on
                                                       label models whose artifact has it
                                                       (spec.vocab_outputs)
    beam:   TEXT BYTES [1]                         ->  TOKEN_IDS INT32 [W, N_gen], SCORES FP32 [W],
                                                       TEXT_OUT BYTES [W]
            constrained to a catalogue (built with --constrained, served with --catalogue):
            + ALLOW_ITEMS INT64 [K], optional          +   ITEM_IDS INT64 [W] (-1: no item)
              (the item ids this request may return)

Checks here are the ones that need no tokenizer (names, datatypes, shapes, sample count,
UTF-8, a text with content); token limits are the engine's, which raises `InvalidInput` naming
sample and limit. They run before admission, so a request whose fault they find is answered 400
under any load (an empty prompt met a full queue first, and got 429 or 504 rather than its 400);
one whose only fault is its token count is admitted first, since counting needs the tokenizer.

One token check needs no tokenizer, and runs here, on the event loop, before admission: a text
of B bytes is at least ceil(B / MAX_TOKEN_BYTES) tokens, because every token of a byte-level
BPE covers at most MAX_TOKEN_BYTES bytes of UTF-8 (Qwen: the longest entry of qwen.tiktoken is
128 bytes, a run of spaces; the added special tokens are at most 20). A template only adds
bytes, so the bound holds for the templated text too. A text whose byte length proves it over
`max_tokens_per_sample`, or texts whose byte lengths prove them over `max_total_tokens`, are
refused in O(1) per text, before they can spend seconds in a tokenizer holding a model's
in-flight slot. (The converse does not hold: B bytes can be up to B tokens, so shorter texts
still go to the engine's exact check.) An engine with another vocabulary can give its own
bound as `spec.max_token_bytes`.

What differs between the tasks (tensors, shapes, defaults, result arrays) is the task's
(artifact/tasks.py); this module turns it into the model's interface and checks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from boundgen.artifact.program import spec_to_dict
from boundgen.artifact.tasks import REBUILD, task_named, task_of  # noqa: F401 (REBUILD: score_api says it too)
from boundgen.errors import ConfigError, InvalidInput
from boundgen.runtime.engine import Engine, EngineSpec
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.text.checks import check_texts
from boundgen.text.utf8 import utf8

MAX_TOKEN_BYTES = 128  # the Qwen vocabulary's longest token, in bytes (see the docstring)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: a dimension bounded by the model's parameters


@dataclass(frozen=True)
class EngineCall:
    """A validated request, ready to run on a worker thread."""

    task: str
    texts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...] | None = None  # score samples given as token ids (no template)
    # [K] int64: a constrained beam request's allow-list (ALLOW_ITEMS); an array does not compare as one value
    allow_items: np.ndarray | None = field(default=None, compare=False)
    allow_subset: str | None = None  # a subset registered with its catalogue, by name (ALLOW_SUBSET)

    def __call__(self, engine: Engine, deadline: float | None = None,
                 cancelled: threading.Event | None = None) -> ScoreResult | BeamResult:
        if self.token_ids is not None:
            return engine.score_ids([list(ids) for ids in self.token_ids], deadline, cancelled)
        if self.allow_items is not None or self.allow_subset is not None:  # a constrained beam request's filter
            return engine.beam(self.texts[0], deadline, cancelled, allow_items=self.allow_items,
                               allow_subset=self.allow_subset)
        return task_named(self.task).call(engine, self.texts, deadline, cancelled)


class Signature:
    def __init__(self, spec: EngineSpec):
        try:
            self.task = task_of(spec)
        except ConfigError:
            raise ValueError(f"model {spec.name}: unknown task {spec.task!r}") from None
        self.spec = program = spec.program
        self.name, self.max_token_bytes = spec.name, spec.max_token_bytes or MAX_TOKEN_BYTES
        self.inputs = tuple(TensorSpec(*t) for t in self.task.inputs(program))
        self.outputs = tuple(TensorSpec(*t) for t in self.task.outputs(program, spec.vocab_outputs))
        self.defaults = self.task.default_outputs([t.name for t in self.outputs])

    @property
    def max_samples(self) -> int:
        return self.spec.max_samples

    @property
    def max_text_bytes(self) -> int:
        """The longest text (UTF-8) a request may hold: longer ones are over the token bound for certain
        (`_check_byte_lengths`; the HTTP routes refuse them while the body arrives, json_values.py)."""
        return self.spec.max_tokens_per_sample * self.max_token_bytes

    def parameters(self) -> dict:
        """The program's task and bounds (its spec's dict form), as listed in the model metadata."""
        return spec_to_dict(self.spec)

    def allowing(self, call: EngineCall, allow_items: Sequence[int] | None = None,
                 subset: str | None = None) -> EngineCall:
        """`call` restricted to the allow-list (ALLOW_ITEMS) and to a named subset (ALLOW_SUBSET;
        whether the ids and the name are the catalogue's is the engine's check, and the list's
        length against the catalogue's items): a model without those inputs refuses them. The ids
        stay one int64 array (no Python object per id)."""
        if "ALLOW_ITEMS" not in [t.name for t in self.inputs]:
            given = "ALLOW_ITEMS" if allow_items is not None else "ALLOW_SUBSET"
            raise InvalidInput(f"model {self.name} has no input {given!r}: it was not built with --constrained")
        if allow_items is not None:
            if len(allow_items) == 0:
                raise InvalidInput("input ALLOW_ITEMS is empty: it allows no item (leave it out to allow every item)")
            call = replace(call, allow_items=np.asarray(allow_items, dtype=np.int64))
        if subset is not None:
            if not isinstance(subset, str) or not subset:
                raise InvalidInput("ALLOW_SUBSET must name a subset of the catalogue (a non-empty text)")
            utf8(subset, "ALLOW_SUBSET")  # a lone surrogate names no subset, and cannot cross to an engine process
            call = replace(call, allow_subset=subset)
        return call

    def call(self, items: Sequence[bytes], shape: Sequence[int] | None = None) -> EngineCall:
        """The engine call of texts (UTF-8), checked as a TEXT input of `shape` is (None: one
        dimension, their count, as a JSON route's texts): the shape, the texts' byte lengths
        against the token bounds, UTF-8."""
        self.check_text_shape(tuple(shape) if shape is not None else (len(items),))
        return self._texts_call(items)

    def _texts_call(self, items: Sequence[bytes]) -> EngineCall:
        self._check_byte_lengths(items)
        texts = []
        for i, item in enumerate(items):
            try:
                texts.append(item.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidInput(f"TEXT[{i}] is not valid UTF-8 (byte {item[exc.start]:#04x} at offset {exc.start})") from None
        # The tokenizer's own content check, with its names: the message is the one the engine gave
        names = ["the prompt"] if self.task.one_prompt else [f"sample {i}" for i in range(len(texts))]
        check_texts(texts, names)
        return EngineCall(self.spec.task, tuple(texts))

    def _check_byte_lengths(self, items: Sequence[bytes]) -> None:
        """Refuse texts whose byte length alone proves them over the token bounds (module docstring)."""
        per_token = self.max_token_bytes
        limit, total = self.spec.max_tokens_per_sample, 0
        for i, item in enumerate(items):
            at_least = -(-len(item) // per_token)
            if at_least > limit:
                raise InvalidInput(f"TEXT[{i}] is {len(item)} bytes, so at least {at_least} tokens (a token is at most "
                                   f"{per_token} bytes), more than the limit of {limit} tokens per sample")
            total += at_least
        if total > self.spec.max_total_tokens:  # a beam prompt's total is its one text's, checked above
            raise InvalidInput(f"the {len(items)} texts are {sum(map(len, items))} bytes, so at least {total} tokens "
                               f"(a token is at most {per_token} bytes), more than the limit of "
                               f"{self.spec.max_total_tokens} tokens per request")

    def check_text_shape(self, shape: tuple[int, ...]) -> None:
        """Refuse a TEXT shape the model's task does not take (the sample count against its bound)."""
        self.task.check_text_shape(shape, self.spec, self.name)
