"""Build the nn.Module for a spec over a loaded model: the task's program module, chosen by task name."""

from __future__ import annotations

from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.model.qwen import QwenModel
from boundgen.programs.beam import BeamProgram
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.programs.head import MLPHead
from boundgen.programs.score import ScoreProgram


def make_program(model: QwenModel, spec: ScoreSpec | BeamSpec, constraint: CatalogueConstraint | None = None):
    """The program for `spec`, its buffers (label ids, stop ids, head, a beam search's catalogue
    constraint) on the model's device. A constrained beam spec without a `constraint` takes its
    trie as inputs (programs/constraint.py)."""
    program = PROGRAMS[spec.task](model, spec, constraint)
    return program.to(model.embed_tokens.device).eval()


def _score_program(model: QwenModel, spec: ScoreSpec, constraint: CatalogueConstraint | None) -> ScoreProgram:
    if constraint is not None:
        raise ValueError("a catalogue constraint restricts beam search; a score program takes none")
    head = MLPHead.load(spec.head_path, model.cfg.hidden_size) if spec.head_path else None
    return ScoreProgram(model, list(spec.label_token_ids), topk=spec.topk, head=head,
                        max_tokens_per_sample=spec.max_tokens_per_sample)


def _beam_program(model: QwenModel, spec: BeamSpec, constraint: CatalogueConstraint | None) -> BeamProgram:
    if constraint is None and spec.constrained:  # the trie comes with every call (a compiled artifact)
        constraint = CatalogueConstraint.inputs(model.cfg.vocab_size, spec.steps, spec.stop_token_ids,
                                                spec.catalogue_max_degree)
    return BeamProgram(model, spec.width, spec.steps, list(spec.stop_token_ids), spec.length_penalty,
                       spec.min_new_tokens, max_prompt_tokens=spec.max_prompt_tokens, constraint=constraint)


PROGRAMS = {"score": _score_program, "beam": _beam_program}  # by task name (artifact/tasks.py)
