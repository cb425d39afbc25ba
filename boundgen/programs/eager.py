"""An engine over the eager program (no compilation): the reference path and the CLI's MODEL_DIR mode.

The same engine as a compiled artifact's (runtime/local_engine.py); only the runner differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import VOCAB_OUTPUTS
from boundgen.errors import ConfigError
from boundgen.model.loader import load_model, parse_dtype
from boundgen.ops.lowering import OpLowering
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.programs.factory import make_program
from boundgen.runtime.local_engine import LocalEngine, make_engine
from boundgen.text.catalogue import Catalogue, check_tokenizer
from boundgen.text.tokenizer import Tokenizer


class EagerRunner:
    """Calls the program module directly, without autograd."""

    def __init__(self, program: torch.nn.Module):
        self.program = program

    def __call__(self, *inputs):
        with torch.inference_mode():
            return self.program(*inputs)


def eager_engine(model_dir, spec: ScoreSpec | BeamSpec, dtype: str = "float32", device: str = "cpu",
                 name: str | None = None, lowering: OpLowering | None = None, runtime: RuntimeConfig = RuntimeConfig(),
                 catalogue: str | Path | None = None, allow_items: Sequence[int] | None = None,
                 allow_subset: str | None = None) -> LocalEngine:
    """runtime: the engine's settings (artifact/manifest.py), as an artifact's manifest would give them;
    catalogue: a catalogue directory (`boundgen catalogue build`) a beam search is restricted
    to, each candidate with its item id; allow_items: the item ids allowed (None: all), within
    the catalogue's subset named `allow_subset` (None: all)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA device is available")
    if catalogue is None and (allow_items is not None or allow_subset is not None):
        raise ConfigError("an allow-list of items or a subset needs a catalogue (--catalogue)")
    task = task_of(spec)
    if catalogue is not None and not task.takes_catalogue:
        raise ConfigError(f"a catalogue restricts beam search; a {task.name} model takes none")
    tokenizer = Tokenizer.from_dir(model_dir)
    model = load_model(model_dir, parse_dtype(dtype), device, (lowering or OpLowering()).resolve())
    constraint = None
    if catalogue is not None:
        cat = Catalogue.load(catalogue)
        check_tokenizer(cat, model_dir, catalogue)
        allowed = cat.allowed_ids(allow_items, allow_subset)  # a ConfigError for unknown ids or subset
        constraint = CatalogueConstraint(cat, model.cfg.vocab_size, spec.steps, spec.stop_token_ids, allowed)
    program = make_program(model, spec, constraint)
    vocab_outputs = set(VOCAB_OUTPUTS) <= set(task.output_names(spec))  # lse, label_logits (programs/score.py)
    return make_engine(name or Path(model_dir).name, spec, tokenizer, EagerRunner(program), device, dtype, runtime,
                       vocab_outputs=vocab_outputs, item_ids=constraint is not None)
