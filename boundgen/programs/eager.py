"""An engine over the eager program (no compilation): the reference path and the CLI's MODEL_DIR mode.

The same engine as a compiled artifact's (runtime/local_engine.py); only the runner differs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.errors import ConfigError
from boundgen.model.loader import load_model, parse_dtype
from boundgen.ops.lowering import OpLowering
from boundgen.programs.factory import make_program
from boundgen.runtime.local_engine import LocalEngine, make_engine
from boundgen.text.tokenizer import Tokenizer


class EagerRunner:
    """Calls the program module directly, without autograd."""

    def __init__(self, program: torch.nn.Module):
        self.program = program

    def __call__(self, *inputs):
        with torch.inference_mode():
            return self.program(*inputs)


def eager_engine(model_dir, spec: ScoreSpec | BeamSpec, dtype: str = "float32", device: str = "cpu",
                 name: str | None = None, lowering: OpLowering | None = None, contexts: int = 1,
                 cuda_graphs: bool = False, batching: bool = False, batch_wait_ms: float = 0.0) -> LocalEngine:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA device is available")
    tokenizer = Tokenizer.from_dir(model_dir)
    model = load_model(model_dir, parse_dtype(dtype), device, (lowering or OpLowering()).resolve())
    program = make_program(model, spec)
    runtime = RuntimeConfig(contexts=contexts, cuda_graphs=cuda_graphs, batching=batching, batch_wait_ms=batch_wait_ms)
    extra = {"vocab_outputs": spec.task == "score" and not spec.head_path}  # lse, label_logits (programs/score.py)
    return make_engine(name or Path(model_dir).name, spec, tokenizer, EagerRunner(program), device, dtype, runtime,
                       extra)
