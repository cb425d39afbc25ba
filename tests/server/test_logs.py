"""Server logs as a log collector reads them: `--log-format json` makes every line of the process
one JSON object (status lines and log records alike) and `serve` still starts, since tools find
the listening line by its message; `--access-log` adds one record per inference request; Triton's
log settings (HTTP /v2/logging, gRPC LogSettings) change level and format while it runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

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


def _grpc_settings(response) -> dict:
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in response.settings.items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_log_settings_change_the_running_server(launch, tmp_path, protocol):
    """Triton's log settings through tritonclient: read the level and format, turn info records (the
    access records) off and on, switch to JSON lines; impossible combinations are refused."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)], args=["--access-log"])
    if protocol == "http":
        c = thttp.InferenceServerClient(server.http_url)
        get, update = c.get_log_settings, c.update_log_settings
    else:
        c = tgrpc.InferenceServerClient(server.grpc_url)
        get, update = (lambda: _grpc_settings(c.get_log_settings())), (lambda s: _grpc_settings(c.update_log_settings(s)))
    assert get() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                     "log_verbose_level": 0, "log_format": "text"}
    infer(server, protocol)  # logged: info
    assert update({"log_info": False})["log_warning"] is True
    assert get()["log_info"] is False
    infer(server, protocol)  # not logged: warning
    bad = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    for settings, status, message in (({"log_error": False}, bad, "log_error cannot be off while warning records"),
                                      ({"log_format": "ISO8601"}, bad, "log_format must be one of"),
                                      ({"log_file": "/tmp/x.log"}, "501" if protocol == "http" else
                                       "StatusCode.UNIMPLEMENTED", "the server logs to its stderr"),
                                      ({"log_color": True}, bad, "unknown log setting 'log_color'")):
        with pytest.raises(InferenceServerException) as err:
            update(settings)
        assert err.value.status() == status and message in err.value.message(), err.value.message()
    assert update({"log_verbose_level": 1, "log_format": "json"}) == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 1,
        "log_format": "json"}
    infer(server, protocol)  # logged, as JSON
    assert server.stop() == 0
    access = [line for line in server.output if "boundgen.access" in line]
    assert len(access) == 2 and not access[0].startswith("{")
    assert json.loads(access[1])["protocol"] == protocol
    assert json.loads(server.output[-1])["msg"] == "boundgen serve: stopped"  # status lines follow the format
