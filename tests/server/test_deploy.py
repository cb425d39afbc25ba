"""The container images and the KServe examples (Dockerfile, Dockerfile.cuda, deploy/kserve/) agree with the code:
their `boundgen serve` command lines parse with the real CLI, their ports are the ones those
command lines listen on, their probes are routes that answer as the probes expect, the files the
Dockerfile copies exist and pass .dockerignore, and shutdown leaves time for the drain. (No docker
build here: CI has no docker daemon.)"""

from __future__ import annotations

import json
import re
import shlex
import urllib.request

import pytest

from boundgen.cli.main import make_parser
from boundgen.server.deploy.frontends import default_frontends
from tests.server.conftest import REPO

yaml = pytest.importorskip("yaml")  # PyYAML: installed with transformers ([test])

KSERVE = REPO / "deploy" / "kserve"


def serve_flags(argv: list[str]) -> dict:
    """`boundgen ARGV` parsed by the CLI's own parser (a serve command line); fails on any unknown flag."""
    try:
        args = make_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`boundgen {shlex.join(argv)}` does not parse with boundgen's CLI")
    assert args.command == "serve", argv
    return vars(args)


def dockerfile(name: str = "Dockerfile") -> dict[str, list[str]]:
    """A Dockerfile's instructions by keyword (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (REPO / name).read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.setdefault(keyword.upper(), []).append(rest.strip())
    return out


def kserve_objects() -> dict[str, dict]:
    """deploy/kserve/'s objects by name."""
    objects = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            objects[doc["metadata"]["name"]] = doc
    return objects


def env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_copies_existing_files_and_serves_with_valid_flags(name):
    instructions = dockerfile(name)
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    for copy in instructions["COPY"]:
        *sources, _ = copy.split()
        for source in sources:
            assert (REPO / source).exists(), f"the Dockerfile copies {source}, which the repo does not have"
            assert f"!{source}" in ignored or f"!{source}/" in ignored, f".dockerignore leaves {source} out"
    (entrypoint,) = instructions["ENTRYPOINT"]
    (cmd,) = instructions["CMD"]
    assert json.loads(entrypoint) == ["boundgen"]
    flags = serve_flags(json.loads(cmd))
    assert flags["host"] == "0.0.0.0", "a container must listen beyond its own loopback"
    (exposed,) = instructions["EXPOSE"]
    assert sorted(int(p) for p in exposed.split()) == sorted([flags["http_port"], flags["grpc_port"]])
    install = [run for run in instructions["RUN"] if "pip install" in run]
    assert len(install) == 1 and "-c /tmp/constraints.txt '.[serve]'" in install[0] and "requirements.txt" in install[0]


def test_cuda_image_installs_a_cuda_torch():
    instructions = dockerfile("Dockerfile.cuda")
    (base,) = instructions["FROM"]
    assert base.startswith("nvidia/cuda:")
    (install,) = [run for run in instructions["RUN"] if "pip install" in run]
    assert "https://download.pytorch.org/whl/${CUDA}" in install and "torch.version.cuda" in install
    args = dict(arg.split("=", 1) for arg in instructions["ARG"])
    assert args["CUDA"].startswith("cu") and base.split(":")[1].startswith(f"{args['CUDA'][2:4]}.{args['CUDA'][4]}")
    lock = (REPO / "requirements.txt").read_text()
    assert f"torch=={args['TORCH']}\n" in lock, "the default torch is the lock's, which CI built artifacts with"


@pytest.mark.parametrize("runtime_name", ["boundgen-cpu", "boundgen-gpu"])
def test_kserve_runtime_probes_ports_and_drain(runtime_name):
    objects = kserve_objects()
    runtime, service = objects[runtime_name], objects["demo-score"]
    (container,) = runtime["spec"]["containers"]
    flags = serve_flags(container["args"])
    assert flags["host"] == "0.0.0.0" and flags["artifacts"] == ["/mnt/models"]  # where KServe puts storageUri
    (port,) = container["ports"]
    assert port["containerPort"] == flags["http_port"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": flags["http_port"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": flags["http_port"]}
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    predictor = service["spec"]["predictor"]
    assert predictor["terminationGracePeriodSeconds"] > float(pre_stop[1]) + flags["drain_timeout_s"], (
        "Kubernetes must not kill the pod before the preStop wait and the drain are over")
    model = predictor["model"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["storageUri"].startswith("pvc://")
    # torch's CPU threads and the front-end processes are counted for the pod, not the node
    cpus = int(container["resources"]["requests"]["cpu"])
    assert 1 <= int(env(container)["OMP_NUM_THREADS"]) <= cpus
    assert flags["frontends"] == default_frontends(cpus), "what serve would pick on a machine of the pod's CPUs"


def test_kserve_service_names_a_runtime_and_the_gpu_one_asks_for_a_gpu():
    objects = kserve_objects()
    assert objects["demo-score"]["spec"]["predictor"]["model"]["runtime"] == "boundgen-cpu"
    gpu = objects["boundgen-gpu"]["spec"]
    (container,) = gpu["containers"]
    assert container["image"] == "boundgen:cuda" and container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == container["resources"]["requests"]["nvidia.com/gpu"]
    assert not any(f.get("autoSelect") for f in gpu["supportedModelFormats"]), "the CPU runtime is the default"
    assert "nvidia.com/gpu" not in objects["boundgen-cpu"]["spec"]["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize("path, body", [("/v2/health/ready", {"ready": True}), ("/v2/health/live", {"live": True})])
def test_probe_routes_answer_as_the_probes_expect(fake_server, path, body):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    with opener.open(f"http://{fake_server.http_url}{path}", timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read()) == body
