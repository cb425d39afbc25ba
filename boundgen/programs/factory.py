"""Build the nn.Module for a spec over a loaded model."""

from __future__ import annotations

from boundgen.model.qwen import QwenModel
from boundgen.programs.beam import BeamProgram
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.programs.head import MLPHead
from boundgen.programs.score import ScoreProgram
from boundgen.artifact.program import BeamSpec, ScoreSpec


def make_program(model: QwenModel, spec: ScoreSpec | BeamSpec, constraint: CatalogueConstraint | None = None):
    """The program for `spec`, its buffers (label ids, stop ids, head, a beam search's catalogue
    constraint) on the model's device. A constrained spec without a `constraint` takes its trie as
    inputs (programs/constraint.py)."""
    if isinstance(spec, ScoreSpec):
        head = MLPHead.load(spec.head_path, model.cfg.hidden_size) if spec.head_path else None
        program = ScoreProgram(model, list(spec.label_token_ids), topk=spec.topk, head=head,
                               max_tokens_per_sample=spec.max_tokens_per_sample)
    else:
        if constraint is None and spec.constrained:  # the trie comes with every call (a compiled artifact)
            constraint = CatalogueConstraint.inputs(model.cfg.vocab_size, spec.steps, spec.stop_token_ids,
                                                    spec.catalogue_max_degree)
        program = BeamProgram(model, spec.width, spec.steps, list(spec.stop_token_ids), spec.length_penalty,
                              spec.min_new_tokens, max_prompt_tokens=spec.max_prompt_tokens, constraint=constraint)
    return program.to(model.embed_tokens.device).eval()
