"""The static DAG's topology validator: rejects broken graphs, orders valid ones."""

import pytest

from boundgen.errors import ArtifactError
from boundgen.runtime.dag import Dag, Node, NodeSpec, validate


def spec(name, inputs, outputs, kind="cpu"):
    return NodeSpec(name, kind, tuple(inputs), tuple(outputs))


def test_valid_graph_runs_in_topological_order():
    specs = [spec("encode", ["probs"], ["result"]), spec("model", ["tokens"], ["probs"], "model"),
             spec("tokenize", ["texts"], ["tokens"])]
    assert validate(specs, ("texts",), ("result",)) == ["tokenize", "model", "encode"]


def test_missing_producer():
    specs = [spec("tokenize", ["texts"], ["tokens"]), spec("model", ["tokens", "cu_seqlens"], ["probs"], "model")]
    with pytest.raises(ArtifactError, match="model reads cu_seqlens, which no node produces"):
        validate(specs, ("texts",), ("probs",))


def test_missing_graph_output():
    with pytest.raises(ArtifactError, match="output result is produced by no node"):
        validate([spec("tokenize", ["texts"], ["tokens"])], ("texts",), ("result",))


def test_duplicate_producer():
    specs = [spec("a", ["texts"], ["tokens"]), spec("b", ["texts"], ["tokens"])]
    with pytest.raises(ArtifactError, match="tokens is produced by both a and b"):
        validate(specs, ("texts",), ("tokens",))


def test_input_produced_again():
    with pytest.raises(ArtifactError, match="texts is produced by both <input> and a"):
        validate([spec("a", ["texts"], ["texts"])], ("texts",), ("texts",))


def test_cycle():
    specs = [spec("a", ["texts", "y"], ["x"]), spec("b", ["x"], ["y"]), spec("c", ["x"], ["out"])]
    with pytest.raises(ArtifactError, match=r"cycle among nodes \['a', 'b', 'c'\]"):
        validate(specs, ("texts",), ("out",))


def test_duplicate_names_and_unknown_kind():
    with pytest.raises(ArtifactError, match="duplicate node names"):
        validate([spec("a", ["t"], ["x"]), spec("a", ["x"], ["y"])], ("t",), ("y",))
    with pytest.raises(ArtifactError, match="unknown kind 'gpu'"):
        validate([spec("a", ["t"], ["x"], "gpu")], ("t",), ("x",))


class Add(Node):
    def __init__(self, name, a, b, out):
        self.spec = spec(name, [a, b], [out])

    def run(self, ctx, **inputs):
        return {self.spec.outputs[0]: sum(inputs.values())}


def test_dag_runs_nodes_and_reports_topology():
    dag = Dag(("x", "y"), [Add("second", "s", "x", "out"), Add("first", "x", "y", "s")], ("out",))
    assert dag.run(None, x=1, y=2) == {"out": 4}
    assert [n["name"] for n in dag.topology()["nodes"]] == ["first", "second"]
    with pytest.raises(ValueError, match="DAG inputs missing: y"):
        dag.run(None, x=1)
