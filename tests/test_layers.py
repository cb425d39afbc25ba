"""The layers as docs/architecture.md draws them, checked on the source: no import cycle between
modules or folders (function-level imports included), runtime/ and server/ never import the
model, the programs or the compiler, artifact/ (the build/serve contract) imports without torch,
ops/ and text/ are leaves, and server/'s core, kserve/, app.py and deploy/ import only downward."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.runtime.results import BeamResult, ScoreResult

PACKAGE = Path(__file__).resolve().parents[1] / "boundgen"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> boundgen modules it imports, at any depth of its code."""
    mods = modules()
    graph = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "boundgen":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.split(".")[0] == "boundgen")
    return graph


def layer(module: str) -> str:
    """boundgen.runtime.engine -> runtime; boundgen.errors -> errors; boundgen -> boundgen."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_folders():
    folders = defaultdict(set)
    for module, targets in import_graph().items():
        for target in targets:
            if layer(module) != layer(target):
                folders[layer(module)].add(layer(target))
    assert cycles(folders) == []


def test_serving_layers_never_import_model_programs_or_compiler():
    forbidden = {"model", "programs", "compile", "cli", "bench"}
    bad = sorted((m, t) for m, targets in import_graph().items() if layer(m) in ("runtime", "server")
                 for t in targets if layer(t) in forbidden)
    assert bad == []


def test_artifact_is_a_leaf():
    bad = sorted((m, t) for m, targets in import_graph().items() if layer(m) == "artifact"
                 for t in targets if layer(t) not in ("artifact", "errors"))
    assert bad == []


def test_artifact_imports_without_torch():
    code = ("import sys, boundgen.artifact.program, boundgen.artifact.tensors, boundgen.artifact.manifest; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_imports():
    """A broken import in a module no test happens to load (a renamed name, a moved module) fails here."""
    code = ("import importlib, pkgutil, boundgen\n"
            "for m in pkgutil.walk_packages(boundgen.__path__, 'boundgen.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_ops_and_text_are_leaves():
    """ops/ (replaceable operators) and text/ (tokenizer, packing, decoding) import no other layer
    but errors: the model calls ops, the runtime and the front ends call text, never the reverse."""
    bad = sorted((m, t) for m, targets in import_graph().items() if layer(m) in ("ops", "text")
                 for t in targets if layer(t) not in (layer(m), "errors"))
    assert bad == []


# server/'s parts, bottom to top; each imports only the parts before it (docs/architecture.md).
SERVER_PARTS = (
    "core",    # admission, served models, signature, metrics, config, auth, logs, status, JSON routes
    "kserve",  # server/kserve/: KServe v2 HTTP and gRPC, wire tensors, shared memory, Triton's extensions
    "app",     # server/app.py: the serving process, the core's models behind kserve/'s listeners
    "deploy",  # server/deploy/: front-end processes, replicas, Ray Serve, the process launcher
    "old",     # old import paths of moved modules, kept for users' code and cluster settings
)
OLD_PATHS = ("boundgen.server.launch", "boundgen.server.ray_proxy")


def server_part(module: str) -> str | None:
    """The part of server/ `module` belongs to (SERVER_PARTS); None outside server/."""
    if not module.startswith("boundgen.server.") and module != "boundgen.server":
        return None
    for prefix, part in (("boundgen.server.kserve", "kserve"), ("boundgen.server.deploy", "deploy")):
        if module == prefix or module.startswith(prefix + "."):
            return part
    if module == "boundgen.server.app":
        return "app"
    return "old" if module in OLD_PATHS else "core"


def test_server_parts_import_only_downward():
    """The core never imports kserve/, app.py or deploy/; kserve/ never imports app.py or deploy/;
    app.py never imports deploy/; nothing imports the old paths."""
    rank = {part: i for i, part in enumerate(SERVER_PARTS)}
    bad = sorted((m, t) for m, targets in import_graph().items() if server_part(m)
                 for t in targets if server_part(t) and rank[server_part(t)] > rank[server_part(m)])
    assert bad == []
    outside = sorted((m, t) for m, targets in import_graph().items() if not server_part(m)
                     for t in targets if server_part(t) == "old")
    assert outside == []


def test_the_core_speaks_engine_calls_not_kserve_tensors():
    """KServe's tensors (kserve/tensors.py Tensor) are parsed into EngineCalls and built from results
    in kserve/ (inference.py): no module of the core names a Tensor, in code or annotations."""
    bad = []
    for module, path in modules().items():
        if server_part(module) == "core":
            names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
            names |= {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
            bad += [module] if "Tensor" in names else []
    assert bad == []


def test_server_parts_are_told_apart():
    assert [server_part(m) for m in ("boundgen.server.models", "boundgen.server.kserve.grpc_api",
                                     "boundgen.server.app", "boundgen.server.deploy.replicas",
                                     "boundgen.server.launch", "boundgen.runtime.engine")] == \
        ["core", "kserve", "app", "deploy", "old", None]


TASK_DEFINITIONS = ("boundgen/artifact/tasks.py",)  # where score and beam are told apart
TASK_CLASSES = {"ScoreSpec", "BeamSpec", "ScoreResult", "BeamResult", "ScoreTask", "BeamTask", "ScoreResultBuilder",
                "BeamResultBuilder", "ScoreProgram", "BeamProgram"}


def _attributes(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} | {name for name in vars(cls) if not name.startswith("_")}


def task_attributes() -> set[str]:
    """What one task's spec or result has and the other's lacks (`steps`, `head_path`, `token_ids`,
    ...): reading one with getattr / hasattr tells the tasks apart by duck typing."""
    return set().union(*(_attributes(a) ^ _attributes(b) for a, b in ((ScoreSpec, BeamSpec),
                                                                       (ScoreResult, BeamResult))))


def task_branches(tree: ast.AST, attributes: frozenset[str] = frozenset()) -> list[int]:
    """Lines that tell score from beam by hand: a comparison with a task's name ("score" / "beam")
    or of anything called `task`, an isinstance against a task's classes, a getattr / hasattr of
    an attribute only one task has (`attributes`: task_attributes())."""
    names = {"score", "beam"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            equality = any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
            for operand in (node.left, *node.comparators):
                values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                named = any(isinstance(v, ast.Constant) and v.value in names for v in values)
                is_task = (isinstance(operand, ast.Name) and operand.id == "task") or (
                    isinstance(operand, ast.Attribute) and operand.attr == "task")
                if named or (equality and is_task):  # `task in TASKS` (a known task?) is no branch
                    lines.append(node.lineno)
                    break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            if TASK_CLASSES & {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}:
                lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in attributes):
            lines.append(node.lineno)
    return lines


def test_score_and_beam_are_told_apart_only_by_their_task_objects():
    """Each task is defined once (artifact/tasks.py); everything else asks the task of a spec or picks
    its part from a registry by task name. A third task must not mean editing branches in 14 files."""
    found, attributes = [], frozenset(task_attributes())
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel not in TASK_DEFINITIONS:
            found += [f"{rel}:{line}" for line in task_branches(ast.parse(path.read_text()), attributes)]
    assert found == []


def test_the_task_branch_finder_finds_branches():
    code = ('if spec.task == "score": pass\nif task != x: pass\nok = mode == "compiled"\n'
            'if isinstance(spec, BeamSpec): pass\nif name in ("score", "beam"): pass\nif kind == "scored": pass\n'
            'if task in TASKS: pass\nn = getattr(spec, "steps", 0)\nn = hasattr(result, "token_ids")\n'
            'n = getattr(args, "contexts")\nn = getattr(spec, "task")\n')
    assert task_branches(ast.parse(code), frozenset(task_attributes())) == [1, 2, 4, 5, 8, 9]


def test_task_attributes_are_those_of_one_task():
    attributes = task_attributes()
    assert {"steps", "constrained", "head_path", "labels", "token_ids", "texts"} <= attributes
    assert not {"task", "template", "scores", "timings", "max_samples", "describe"} & attributes
