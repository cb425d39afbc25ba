"""Each task (score, beam) defined once: what varies between them, as one object per task.

A `Task` says, for its spec class (artifact/program.py): the program's outputs and tensor
interface, the dims of its packed inputs and their bounds, how a request's texts reach the
engine, the served model's input and output tensors and their checks, how a result becomes
output arrays, the build's example and validation cases and its memory-bound hints. Everything
else asks the task of a spec (`task_of(spec)`) instead of comparing task names. What needs torch,
a model or a tokenizer stays in its layer, chosen there by task name from one registry: the
program module (programs/factory.py), the result builder (runtime/requests.py), the export
(compile/export.py), the build's spec (compile/config.py), the peer's and the bench's calls
(bench/). A third task is one more `Task` here plus one entry in each of those.

No torch here (artifact/ is the build/serve contract, imported by servers without torch).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Set as AbstractSet
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from boundgen.artifact.program import SPECS, BeamSpec, ScoreSpec
from boundgen.artifact.tensors import BEAM_OUTPUTS, FILTERS, ITEM_OUTPUT, TRIE, score_outputs
from boundgen.errors import ConfigError, InvalidInput, WrongTask

# Requests one batched score call may hold (a beam program records its own, BeamSpec.max_requests; a score
# program's bounds count samples and tokens): admission's room per context when score requests share calls.
SCORE_MAX_REQUESTS = 8
SAMPLE_TEXT = "query: running shoes | item: trail shoe"


@dataclass(frozen=True)
class Case:
    """One validation input: packed sample lengths, and padding after them."""

    name: str
    lengths: tuple[int, ...]  # tokens per sample (beam: the prompt)
    tail: int = 0  # tokens after the last sample, of no sample (beam padding, runtime/graphs.py)


class Task:
    """What a task is; subclasses fill it in. Methods take the task's spec (its bounds)."""

    name: str
    spec_class: type
    # The packed inputs' dims (tokens, sequences), named as the manifest records them.
    tokens_dim: str
    sequences_dim: str
    one_prompt: bool  # a request is one prompt (errors speak of "the prompt"), not N samples
    takes_token_ids: bool  # samples may come as token ids (`Engine.score_ids`)
    takes_catalogue: bool  # a catalogue may restrict its outputs (programs/constraint.py)
    result_rows: str  # what a result's rows are, as the server's metrics count them

    def __repr__(self) -> str:
        return f"<task {self.name}>"

    # -- the program -----------------------------------------------------------------------
    def output_names(self, spec) -> tuple[str, ...]:
        """The outputs of the spec's program (as built now), in order."""
        raise NotImplementedError

    def output_tensors(self, spec, num_classes: int) -> dict[str, tuple[str, list]]:
        """The program's outputs: name -> (dtype, shape with dims by name)."""
        raise NotImplementedError

    def tensor_interface(self, spec, num_classes: int) -> dict:
        """The program's tensors (what the manifest records): direction, dtype, shape with dims by name."""
        tokens, seqs = self.tokens_dim, f"{self.sequences_dim}+1"
        inputs = {"tokens": ("int64", [tokens]), "positions": ("int64", [tokens]), "cu_seqlens": ("int32", [seqs])}
        return {**{name: {"direction": "input", "dtype": d, "shape": s} for name, (d, s) in inputs.items()},
                **{name: {"direction": "output", "dtype": d, "shape": s}
                   for name, (d, s) in self.output_tensors(spec, num_classes).items()}}

    def dim_bounds(self, spec) -> dict[str, tuple[int, int]]:
        """The packed inputs' named dims and their [min, max] (the manifest records these)."""
        raise NotImplementedError

    def max_requests(self, spec) -> int:
        """Requests one program call may hold when requests are batched."""
        raise NotImplementedError

    def steps(self, spec) -> int:
        """Tokens the program generates, N_gen (its compiled stages run the decode step N_gen - 1
        times); 0: a prefill-only program."""
        return 0

    def constrained(self, spec) -> bool:
        """Whether the program takes a catalogue's trie as inputs (built with --constrained)."""
        return False

    def head_path(self, spec) -> str | None:
        """The MLP head file the program's outputs come from; None: it has none."""
        return None

    # -- requests --------------------------------------------------------------------------
    def texts(self, call: str, payload, model: str, limit: int) -> list[str]:
        """An engine call's payload (`engine.score(texts)` / `engine.beam(text)`) as the request's texts,
        at most `limit` + 1 of them read (the request's count check refuses more); WrongTask when the model
        is not of the task `call` names."""
        if call != self.name:
            raise WrongTask(f"model {model} is a {self.name} model, not a {call} model")
        return self._texts(payload, limit)

    def _texts(self, payload, limit: int) -> list[str]:
        raise NotImplementedError

    def call(self, engine, texts: Sequence[str], deadline: float | None = None, cancelled=None):
        """Run a request's texts on an `Engine` (runtime/engine.py) through the task's method."""
        raise NotImplementedError

    def request_texts(self, texts: Sequence[str]) -> list[str]:
        """The texts a client sends for a request (bench workloads: beam sends its one prompt)."""
        return list(texts)[:1] if self.one_prompt else list(texts)

    def sample_texts(self, spec) -> list[str]:
        """A representative request (a build's load report, warm-up)."""
        raise NotImplementedError

    # -- the served model: tensors and their checks -----------------------------------------
    def inputs(self, spec) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """(name, datatype, shape) of the served model's inputs; -1: bounded by the spec."""
        raise NotImplementedError

    def outputs(self, spec, vocab_outputs: bool) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        raise NotImplementedError

    def default_outputs(self, outputs: Sequence[str]) -> tuple[str, ...]:
        """The outputs a request that names none gets."""
        raise NotImplementedError

    def check_text_shape(self, shape: tuple[int, ...], spec, model: str) -> None:
        raise NotImplementedError

    def json_values(self, spec, admitted: int) -> int:
        """JSON values a request to the model needs besides its envelope (server/json_values.py);
        `admitted`: the requests the server admits to the model at once (in flight and queued)."""
        raise NotImplementedError

    def text_tokens(self, spec, admitted: int) -> int:
        """The most tokens the texts of one request to the model can hold in all, on any route
        (server/json_values.py); `admitted` as in `json_values`."""
        raise NotImplementedError

    def output_arrays(self, result, names: Sequence[str], model: str) -> dict[str, tuple[str, object]]:
        """An engine result (runtime/results.py) as output arrays by name: (datatype, array or list of bytes)."""
        raise NotImplementedError

    # -- building --------------------------------------------------------------------------
    def example_lengths(self, spec) -> list[int]:
        """Sample lengths of the example the program is traced on (compile/export.py)."""
        raise NotImplementedError

    def validation_cases(self, spec, token_bucket: int) -> list[Case]:
        raise NotImplementedError

    def judged_by(self, exact: bool, quantized: bool) -> str | None:
        """What build validation compares beyond each output's tolerance, against the FP32 program:
        "candidates", "labels", or None (compile/validate.py)."""
        raise NotImplementedError

    def memory_shape(self, spec) -> tuple[int, int, int]:
        """(tokens, longest sequence, logit rows) of the largest call: a build's memory estimate."""
        raise NotImplementedError

    bounds_to_lower: str  # the flags that shrink a build's memory (compile/memory.py)


class ScoreTask(Task):
    name, spec_class = "score", ScoreSpec
    tokens_dim, sequences_dim = "T", "B"
    one_prompt, takes_token_ids, takes_catalogue = False, True, False
    result_rows = "samples"
    bounds_to_lower = "--max-total-tokens (or --max-samples, --max-tokens-per-sample)"

    def output_names(self, spec: ScoreSpec) -> tuple[str, ...]:
        return score_outputs(spec.topk, vocab=not spec.head_path)

    def output_tensors(self, spec: ScoreSpec, num_classes: int) -> dict:
        rows = self.sequences_dim
        tensors = {"probs": ("float32", [rows, num_classes])}
        if not spec.head_path:
            tensors["lse"] = ("float32", [rows])
            tensors["label_logits"] = ("float32", [rows, num_classes])
        if spec.topk:
            tensors["topk_ids"] = ("int64", [rows, spec.topk])
            tensors["topk_probs"] = ("float32", [rows, spec.topk])
        return tensors

    def dim_bounds(self, spec: ScoreSpec) -> dict:
        return {"T": (1, spec.max_total_tokens), "B": (1, spec.max_samples + 1)}

    def max_requests(self, spec: ScoreSpec) -> int:
        return SCORE_MAX_REQUESTS

    def head_path(self, spec: ScoreSpec) -> str | None:
        return spec.head_path or None

    def _texts(self, payload, limit: int) -> list[str]:
        if isinstance(payload, (str, bytes, Mapping, AbstractSet)) or not isinstance(payload, Iterable):
            raise InvalidInput(f"score takes a list of texts, got {type(payload).__name__}")
        return list(itertools.islice(payload, limit + 1))  # a generator that never ends is read no further

    def call(self, engine, texts, deadline=None, cancelled=None):
        return engine.score(list(texts), deadline, cancelled)

    def sample_texts(self, spec: ScoreSpec) -> list[str]:
        return [SAMPLE_TEXT] * min(spec.max_samples, 15)

    def inputs(self, spec):
        return (("TEXT", "BYTES", (-1,)),)

    def outputs(self, spec: ScoreSpec, vocab_outputs: bool):
        labels = len(spec.label_token_ids)
        out = (("SCORES", "FP32", (-1, labels)), ("NUM_TOKENS", "INT32", (-1,)))
        if vocab_outputs and not spec.head_path:
            out += (("LABEL_LOGPROBS", "FP32", (-1, labels)),)
        return out

    def default_outputs(self, outputs):
        return ("SCORES",)

    def check_text_shape(self, shape, spec: ScoreSpec, model: str) -> None:
        if len(shape) != 1:
            raise InvalidInput(f"input TEXT must have shape [N] (one text per sample), got {list(shape)}")
        n, limit = shape[0], spec.max_samples
        if n == 0:
            raise InvalidInput(f"input TEXT is empty: a score request needs 1 to {limit} samples")
        if n > limit:
            raise InvalidInput(f"input TEXT has {n} samples, over the limit of {limit} for model {model}")

    def json_values(self, spec: ScoreSpec, admitted: int) -> int:
        # texts (TEXT, /v1/score items, /v1/rerank documents as {"text": ...}: 3 values each, vLLM's
        # text_1 and text_2) or token ids (/v1/score: the query's, and every item's)
        return 3 * spec.max_samples + spec.max_tokens_per_sample + spec.max_total_tokens

    def text_tokens(self, spec: ScoreSpec, admitted: int) -> int:
        return spec.max_total_tokens  # a query shared by the samples is in the body once, in each sample

    def output_arrays(self, result, names, model: str) -> dict:
        out = {"SCORES": ("FP32", np.ascontiguousarray(result.scores, dtype=np.float32))}
        if "NUM_TOKENS" in names:
            if result.num_tokens is None:
                raise InvalidInput(f"model {model} does not report token counts")
            out["NUM_TOKENS"] = ("INT32", np.ascontiguousarray(result.num_tokens, dtype=np.int32))
        if "LABEL_LOGPROBS" in names:
            if result.label_logprobs is None:
                raise InvalidInput(f"model {model} gave no vocabulary log-probabilities: {REBUILD}")
            out["LABEL_LOGPROBS"] = ("FP32", np.ascontiguousarray(result.label_logprobs, dtype=np.float32))
        return out

    def example_lengths(self, spec: ScoreSpec) -> list[int]:
        samples = max(2, min(15, spec.max_samples))  # <= max_samples + 1: the filler's slot
        samples = min(samples, spec.max_total_tokens)
        per_sample = max(1, min(max(1, spec.max_tokens_per_sample // 2), spec.max_total_tokens // samples))
        if per_sample * samples in (samples, samples + 1) and per_sample > 1:
            per_sample -= 1
        return [per_sample] * samples

    def validation_cases(self, spec: ScoreSpec, token_bucket: int) -> list[Case]:
        per, total, most = spec.max_tokens_per_sample, spec.max_total_tokens, spec.max_samples
        mixed = [max(1, min(per, n)) for n in (per // 2, 1, per, per // 3)[: min(most, 4)]]
        while sum(mixed) > total:  # shrink the longest sample, then drop samples
            longest = mixed.index(max(mixed))
            if mixed[longest] > 1:
                mixed[longest] //= 2
            else:
                mixed.pop()
        # Bucketed padding for CUDA graphs (runtime/graphs.py): one filler sequence shorter than a
        # bucket (a longer one is never made, and would cost the eager reference its length squared),
        # then empty ones.
        filler = min(total - sum(mixed), max(1, token_bucket - 1))
        padded = tuple(mixed) + (filler,) + (0,) * (most - len(mixed))
        return [Case("one_sample_one_token", (1,)), Case("representative", tuple(mixed)),
                Case("max_samples_max_tokens", _fill(most, per, total)),
                Case("one_sample_max_tokens", (min(per, total),)), Case("padded_for_cuda_graphs", padded)]

    def judged_by(self, exact: bool, quantized: bool) -> str | None:
        return "labels" if quantized else None

    def memory_shape(self, spec: ScoreSpec) -> tuple[int, int, int]:
        return spec.max_total_tokens, spec.max_tokens_per_sample, spec.max_samples


class BeamTask(Task):
    name, spec_class = "beam", BeamSpec
    tokens_dim, sequences_dim = "L", "R"  # prompt tokens, requests (of W beams each)
    one_prompt, takes_token_ids, takes_catalogue = True, False, True
    result_rows = "candidates"
    bounds_to_lower = "--max-prompt-tokens or --max-requests"

    def output_names(self, spec: BeamSpec) -> tuple[str, ...]:
        return BEAM_OUTPUTS + ((ITEM_OUTPUT,) if spec.constrained else ())

    def output_tensors(self, spec: BeamSpec, num_classes: int) -> dict:
        rows, n = f"R*{spec.width}", spec.steps
        out = {"token_ids": ("int64", [rows, n]), "scores": ("float32", [rows]), "finished": ("bool", [rows]),
               "beam_indices": ("int64", [rows, n])}
        if spec.constrained:  # the item each candidate names (programs/constraint.py)
            out[ITEM_OUTPUT] = ("int64", [rows])
        return out

    def tensor_interface(self, spec: BeamSpec, num_classes: int) -> dict:
        """A constrained program also takes the catalogue's trie, of one length M, the allow-lists'
        reach and ends a row per request (artifact/tensors.py)."""
        tensors = super().tensor_interface(spec, num_classes)
        if spec.constrained:
            tensors.update({name: {"direction": "input", "dtype": "bool" if name in FILTERS else "int64",
                                   "shape": ["R", "M"] if name in FILTERS else ["M"]} for name in TRIE})
        return tensors

    def dim_bounds(self, spec: BeamSpec) -> dict:
        return {"L": (1, spec.call_max_tokens), "R": (1, spec.max_requests)}

    def max_requests(self, spec: BeamSpec) -> int:
        return spec.max_requests

    def steps(self, spec: BeamSpec) -> int:
        return spec.steps

    def constrained(self, spec: BeamSpec) -> bool:
        return spec.constrained

    def _texts(self, payload, limit: int) -> list[str]:
        if not isinstance(payload, str):
            raise InvalidInput(f"beam takes one prompt text, got {type(payload).__name__}")
        return [payload]

    def call(self, engine, texts, deadline=None, cancelled=None):
        return engine.beam(texts[0], deadline, cancelled)

    def sample_texts(self, spec: BeamSpec) -> list[str]:
        return ["query: running shoes -> item:"]

    def inputs(self, spec):
        # A constrained model's optional filters: the item ids a request may return, a named subset.
        constrained = (("ALLOW_ITEMS", "INT64", (-1,)), ("ALLOW_SUBSET", "BYTES", (1,)))
        return (("TEXT", "BYTES", (1,)),) + (constrained if spec.constrained else ())

    def outputs(self, spec: BeamSpec, vocab_outputs: bool):
        constrained = (("ITEM_IDS", "INT64", (spec.width,)),) if spec.constrained else ()
        return (("TOKEN_IDS", "INT32", (spec.width, spec.steps)), ("SCORES", "FP32", (spec.width,)),
                ("TEXT_OUT", "BYTES", (spec.width,))) + constrained

    def default_outputs(self, outputs):
        return tuple(outputs)

    def check_text_shape(self, shape, spec: BeamSpec, model: str) -> None:
        if shape != (1,):
            raise InvalidInput(f"input TEXT of beam model {model} must have shape [1] (one prompt), "
                               f"got {list(shape)}")

    def json_values(self, spec: BeamSpec, admitted: int) -> int:
        return admitted  # /v1/beam: prompts, as many as the model admits at once (beam_api.check_count)

    def text_tokens(self, spec: BeamSpec, admitted: int) -> int:
        return admitted * spec.max_prompt_tokens

    def output_arrays(self, result, names, model: str) -> dict:
        out = {"TOKEN_IDS": ("INT32", np.ascontiguousarray(result.token_ids, dtype=np.int32)),
               "SCORES": ("FP32", np.ascontiguousarray(result.scores, dtype=np.float32)),
               "TEXT_OUT": ("BYTES", [t.encode("utf-8") for t in result.texts])}
        if "ITEM_IDS" in names:
            out["ITEM_IDS"] = ("INT64", np.ascontiguousarray(result.item_ids, dtype=np.int64))
        return out

    def example_lengths(self, spec: BeamSpec) -> list[int]:
        # Beam prompts stay short, as in the first H200 beam build that compiled (2026-11-29): the build
        # with ~100-token prompts failed, later traced to a codegen race (compile/aoti.py), not to
        # the sizes, so longer examples are untried. The decode step, where beam time goes, is
        # tuned for R x W rows either way.
        if spec.max_requests == 1:
            return [min(5, spec.max_prompt_tokens)]
        requests = min(3, spec.max_requests)  # R equal to no other size (K, W): nothing specialises
        return [max(1, min(3 + i, spec.max_prompt_tokens)) for i in range(requests)]

    def validation_cases(self, spec: BeamSpec, token_bucket: int) -> list[Case]:
        longest = spec.max_prompt_tokens
        typical = min(64, max(1, longest // 2))
        out = [Case("one_token_prompt", (1,)), Case("representative", (typical,)), Case("max_prompt", (longest,))]
        if spec.max_requests > 1:  # several prompts in one call, each request's rows as if alone
            out += [Case("several_requests", (typical, 1, longest)[: spec.max_requests]),
                    Case("max_requests_max_prompt", (longest,) * spec.max_requests)]
        padded = (typical, 1)[: spec.max_requests]
        tail = min(7, spec.call_max_tokens - sum(padded))
        if tail > 0:
            out.append(Case("padded_for_cuda_graphs", padded, tail))
        return out

    def judged_by(self, exact: bool, quantized: bool) -> str | None:
        return None if exact else "candidates"

    def memory_shape(self, spec: BeamSpec) -> tuple[int, int, int]:
        rows = spec.width * spec.max_requests
        return (spec.max_prompt_tokens * spec.max_requests + rows * spec.steps, spec.max_prompt_tokens + spec.steps,
                rows)


# Why an artifact has no LABEL_LOGPROBS, and what to do, in the words of those who asked for it.
REBUILD = ("its artifact was built without the vocabulary log-sum-exp (before it existed, or with an MLP head); "
           "rebuild it from its checkpoint with this boundgen (`boundgen build ... --task score --labels ...`) "
           "to get probabilities over the whole vocabulary")

TASKS: dict[str, Task] = {task.name: task for task in (ScoreTask(), BeamTask())}
assert set(TASKS) == set(SPECS)


def task_named(name: str) -> Task:
    task = TASKS.get(name)
    if task is None:
        raise ConfigError(f"unknown task {name!r}; expected {' or '.join(TASKS)}")
    return task


def task_of(spec) -> Task:
    """The task of a program spec (ScoreSpec, BeamSpec), or of anything with a `task` name."""
    return task_named(spec.task)


def _fill(samples: int, per_sample: int, total: int) -> tuple[int, ...]:
    """As many samples (<= `samples`) as fit, as long as possible, within `total` tokens."""
    samples = min(samples, total)
    lengths = [1] * samples
    budget = total - samples
    for i in range(samples):
        add = min(per_sample - 1, budget)
        lengths[i] += add
        budget -= add
    return tuple(lengths)
