"""An engine over the eager program (no compilation): the reference path and the CLI's MODEL_DIR mode.

Same DAG, contexts and nodes as a compiled artifact; only the model node's runner differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from boundgen.errors import ConfigError
from boundgen.model.loader import load_model, parse_dtype
from boundgen.ops.lowering import OpLowering
from boundgen.programs.factory import make_program
from boundgen.programs.spec import BeamSpec, ScoreSpec
from boundgen.runtime.context import ContextPool, RequestContext
from boundgen.runtime.dag import Dag
from boundgen.runtime.engine import EngineSpec
from boundgen.runtime.executor import DagEngine
from boundgen.runtime.graphs import GraphRunner
from boundgen.runtime.nodes import beam_nodes, score_nodes
from boundgen.text.tokenizer import Tokenizer


def default_stop_tokens(model_dir) -> tuple[int, ...]:
    """Stop tokens as HF generate takes them: generation_config.json's eos_token_id, else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else (int(eos),)
    return ()


def label_token_ids(tokenizer: Tokenizer, labels) -> tuple[int, ...]:
    return tuple(tokenizer.token_id(label) for label in labels)


def engine_spec(name: str, spec, device: str, dtype: str) -> EngineSpec:
    common = dict(name=name, task=spec.task, max_samples=spec.max_samples,
                  max_tokens_per_sample=spec.max_tokens_per_sample, max_total_tokens=spec.max_total_tokens,
                  device=device, dtype=dtype)
    if isinstance(spec, ScoreSpec):
        return EngineSpec(labels=tuple(spec.labels), label_token_ids=tuple(spec.label_token_ids), **common)
    return EngineSpec(width=spec.width, steps=spec.steps, **common)


class EagerRunner:
    """Calls the program module directly, without autograd."""

    def __init__(self, program: torch.nn.Module):
        self.program = program

    def __call__(self, *inputs):
        with torch.inference_mode():
            return self.program(*inputs)


def make_dag_engine(name, spec, tokenizer, runner, device: str, dtype: str, contexts: int = 1,
                    executors: int = 1, cuda_graphs: bool = False, token_bucket: int = 256) -> DagEngine:
    """Assemble the static DAG and the context pool around a runner (eager or compiled).

    With `cuda_graphs` on a CUDA device the runner is wrapped in a GraphRunner and score
    batches are padded to multiples of `token_bucket` tokens (runtime/graphs.py)."""
    use_graphs = cuda_graphs and device.startswith("cuda")
    if use_graphs:
        runner = GraphRunner(runner)
    bucket = token_bucket if use_graphs and isinstance(spec, ScoreSpec) else 0
    make = score_nodes if isinstance(spec, ScoreSpec) else beam_nodes
    inputs, nodes, outputs = make(tokenizer, spec, runner, executors, bucket)
    dev = torch.device(device)
    pool = ContextPool([RequestContext(spec.max_total_tokens, spec.max_samples, dev) for _ in range(contexts)])
    warm = [{"texts": ["warm up"]}] if isinstance(spec, ScoreSpec) else [{"text": "warm up"}]
    return DagEngine(engine_spec(name, spec, device, dtype), Dag(inputs, nodes, outputs), pool, warm)


def eager_engine(model_dir, spec: ScoreSpec | BeamSpec, dtype: str = "float32", device: str = "cpu",
                 name: str | None = None, lowering: OpLowering | None = None, contexts: int = 1,
                 cuda_graphs: bool = False) -> DagEngine:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA device is available")
    tokenizer = Tokenizer.from_dir(model_dir)
    model = load_model(model_dir, parse_dtype(dtype), device, (lowering or OpLowering()).resolve())
    program = make_program(model, spec)
    return make_dag_engine(name or Path(model_dir).name, spec, tokenizer, EagerRunner(program), device, dtype,
                           contexts, cuda_graphs=cuda_graphs)
