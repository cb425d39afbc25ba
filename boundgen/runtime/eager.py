"""An engine over the eager program (no compilation): the reference path and the CLI's MODEL_DIR mode.

Same DAG, contexts and nodes as a compiled artifact (runtime/assemble.py); only the model
node's runner differs.
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
from boundgen.runtime.assemble import make_dag_engine
from boundgen.runtime.executor import DagEngine
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


class EagerRunner:
    """Calls the program module directly, without autograd."""

    def __init__(self, program: torch.nn.Module):
        self.program = program

    def __call__(self, *inputs):
        with torch.inference_mode():
            return self.program(*inputs)


def eager_engine(model_dir, spec: ScoreSpec | BeamSpec, dtype: str = "float32", device: str = "cpu",
                 name: str | None = None, lowering: OpLowering | None = None, contexts: int = 1,
                 cuda_graphs: bool = False, batching: bool = False) -> DagEngine:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA device is available")
    tokenizer = Tokenizer.from_dir(model_dir)
    model = load_model(model_dir, parse_dtype(dtype), device, (lowering or OpLowering()).resolve())
    program = make_program(model, spec)
    return make_dag_engine(name or Path(model_dir).name, spec, tokenizer, EagerRunner(program), device, dtype,
                           contexts, cuda_graphs=cuda_graphs, batching=batching)
