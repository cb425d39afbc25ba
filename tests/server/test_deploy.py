"""The container image and the KServe examples (Dockerfile, deploy/kserve/) agree with the code:
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


def dockerfile() -> dict[str, list[str]]:
    """Dockerfile instructions by keyword (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.setdefault(keyword.upper(), []).append(rest.strip())
    return out


def kserve_objects() -> dict[str, dict]:
    objects = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            objects[doc["kind"]] = doc
    return objects


def test_dockerfile_copies_existing_files_and_serves_with_valid_flags():
    instructions = dockerfile()
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
    (run,) = instructions["RUN"]
    assert "-c /tmp/constraints.txt '.[serve]'" in run and "requirements.txt" in run


def test_kserve_runtime_probes_ports_and_drain():
    objects = kserve_objects()
    runtime, service = objects["ServingRuntime"], objects["InferenceService"]
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
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["storageUri"].startswith("pvc://")


@pytest.mark.parametrize("path, body", [("/v2/health/ready", {"ready": True}), ("/v2/health/live", {"live": True})])
def test_probe_routes_answer_as_the_probes_expect(fake_server, path, body):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    with opener.open(f"http://{fake_server.http_url}{path}", timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read()) == body
