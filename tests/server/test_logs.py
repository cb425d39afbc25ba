"""Server logs as a log collector reads them: `--log-format json` makes every line of the process
one JSON object (status lines and log records alike) and `serve` still starts, since tools find
the listening line by its message; `--access-log` adds one record per inference request."""

from __future__ import annotations

import json

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from tests.server.conftest import SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact


def infer(server, protocol: str):
    module = thttp if protocol == "http" else tgrpc
    t = module.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"a relevant document"], dtype=object))
    url = server.http_url if protocol == "http" else server.grpc_url
    return module.InferenceServerClient(url).infer("fscore", [t]).as_numpy("SCORES")


def test_json_lines_and_an_access_record_per_request(launch, tmp_path):
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)], args=["--log-format", "json",
                                                                                 "--access-log"])
    assert infer(server, "http").shape == (1, 2) and infer(server, "grpc").shape == (1, 2)
    assert server.stop() == 0
    lines = [json.loads(line) for line in server.output if line.strip()]  # every line parses
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert any(line["msg"].startswith("boundgen serve: listening http=") for line in lines)
    access = [line for line in lines if line["logger"] == "boundgen.access"]
    assert [(a["model"], a["protocol"], a["outcome"]) for a in access] == [("fscore", "http", "success"),
                                                                          ("fscore", "grpc", "success")]
    assert all(a["level"] == "INFO" and a["ms"] >= 0 for a in access)


def test_text_is_the_default_and_requests_are_not_logged(launch, tmp_path):
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)])
    infer(server, "http")
    assert server.stop() == 0
    assert any(line.startswith("boundgen serve: listening http=") for line in server.output)
    assert not any("boundgen.access" in line for line in server.output)


def test_log_level_warning_drops_access_records(launch, tmp_path):
    """Access records are INFO: at --log-level warning they are not written; status lines still are."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)], args=["--access-log", "--log-level",
                                                                                 "warning"])
    infer(server, "http")
    assert server.stop() == 0
    assert any(line.startswith("boundgen serve: listening http=") for line in server.output)
    assert not any("boundgen.access" in line for line in server.output)
