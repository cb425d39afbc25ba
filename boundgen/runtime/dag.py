"""Static DAG: nodes with declared tensor inputs/outputs, validated once at load, run per request.

The topology is fixed when an artifact is loaded; a request only brings data. Validation
rejects a graph whose inputs have no producer, whose names are produced twice, or that has a
cycle, and fixes the execution order (a topological sort) once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from boundgen.errors import ArtifactError


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: str  # "cpu" | "model"
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "inputs": list(self.inputs), "outputs": list(self.outputs)}


class Node:
    """A unit of work. `run(ctx, **inputs)` returns a dict with exactly `spec.outputs`."""

    spec: NodeSpec

    def run(self, ctx, **inputs) -> dict:
        raise NotImplementedError


class Dag:
    def __init__(self, graph_inputs: tuple[str, ...], nodes: list[Node], graph_outputs: tuple[str, ...]):
        self.graph_inputs = tuple(graph_inputs)
        self.graph_outputs = tuple(graph_outputs)
        self.order = validate([n.spec for n in nodes], self.graph_inputs, self.graph_outputs)
        by_name = {n.spec.name: n for n in nodes}
        self.nodes = [by_name[name] for name in self.order]

    def topology(self) -> dict:
        return {"inputs": list(self.graph_inputs), "outputs": list(self.graph_outputs),
                "nodes": [n.spec.to_dict() for n in self.nodes]}

    def run(self, ctx, timings: dict | None = None, **inputs) -> dict:
        missing = [name for name in self.graph_inputs if name not in inputs]
        if missing:
            raise ValueError(f"DAG inputs missing: {', '.join(missing)}")
        values = dict(inputs)
        for node in self.nodes:
            start = time.perf_counter()
            out = node.run(ctx, **{name: values[name] for name in node.spec.inputs})
            if timings is not None:
                timings[node.spec.name] = timings.get(node.spec.name, 0.0) + time.perf_counter() - start
            values.update(out)
        return {name: values[name] for name in self.graph_outputs}


def validate(specs: list[NodeSpec], graph_inputs: tuple[str, ...], graph_outputs: tuple[str, ...]) -> list[str]:
    """Check a topology and return node names in execution order."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ArtifactError(f"DAG has duplicate node names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    producer = {name: "<input>" for name in graph_inputs}
    for s in specs:
        if s.kind not in ("cpu", "model"):
            raise ArtifactError(f"DAG node {s.name} has unknown kind {s.kind!r}; expected cpu or model")
        for out in s.outputs:
            if out in producer:
                raise ArtifactError(f"DAG tensor {out} is produced by both {producer[out]} and {s.name}")
            producer[out] = s.name
    for s in specs:
        for inp in s.inputs:
            if inp not in producer:
                raise ArtifactError(f"DAG node {s.name} reads {inp}, which no node produces")
    for out in graph_outputs:
        if out not in producer:
            raise ArtifactError(f"DAG output {out} is produced by no node")
    # Kahn's algorithm over node -> node edges.
    deps = {s.name: {producer[i] for i in s.inputs if producer[i] != "<input>"} for s in specs}
    order, ready = [], [s.name for s in specs if not deps[s.name]]
    while ready:
        name = ready.pop(0)
        order.append(name)
        for other, d in deps.items():
            if name in d:
                d.discard(name)
                if not d and other not in order and other not in ready:
                    ready.append(other)
    if len(order) != len(specs):
        raise ArtifactError(f"DAG has a cycle among nodes {sorted(set(names) - set(order))}")
    return order
