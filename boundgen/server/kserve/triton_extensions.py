"""Triton's protocol extensions that tritonclient and perf_analyzer call besides inference:
model configuration, statistics, the repository index (load / unload: repository.py), trace and
log settings (shared memory: shared_memory.py).

    HTTP                                                 gRPC                    answer
    GET  /v2/models/{m}[/versions/1]/config              ModelConfig             model_config()
    GET  /v2/models/stats, /v2/models/{m}[/versions/1]/stats   ModelStatistics   model_statistics()
    POST /v2/repository/index                            RepositoryIndex         repository_index()
    POST /v2/repository/models/{m}/load | unload         RepositoryModelLoad | Unload   repository.py
    GET | POST /v2[/models/{m}]/trace/setting            TraceSetting            trace_settings()
    GET | POST /v2/logging                               LogSettings             log_settings()

Each answer is built here once, as Triton's HTTP JSON; that JSON is protobuf's JSON mapping of
the gRPC message, so `to_message` makes the gRPC answer from the same dict (kserve.proto holds
the messages, with Triton's field numbers).

Config: name, platform "boundgen", max_batch_size 0 (a request's shape is the model's own: a
score request's N texts are not Triton's batch dimension), inputs and outputs from the model's
Signature (BYTES is Triton's TYPE_STRING; -1 marks a bounded dimension), one instance group
whose count is the engine's request contexts, the program's task and bounds as parameters (with
the admission bounds and the artifact's directory name: never its path on the server), and
`dynamic_batching` (queue delay 0: a free context takes what waits and never waits for more) when
the engine batches concurrent requests into one model call. Triton itself batches only along a
batch dimension (max_batch_size > 0); here the engine packs requests' tokens, so the pair says
"batched by the server, shapes per request" to a client that reads it.

Statistics come from the server's own metrics (metrics.py `phase_totals`), cumulative since start:
`success` / `fail` count and time requests end to end by outcome; `queue` is the wait for an
in-flight slot; `compute_input` / `compute_output` are the engine's `pre` (tokenize, pack) and
`post` (decode) stages; `compute_infer` is the rest of the engine call (model, and any wait for
a batch or a context inside the engine). `inference_count` counts successful requests,
`execution_count` engine calls (with batching several calls may share one model execution).

Trace settings: this server does not trace requests (its per-request timings are the metrics and
statistics above), so trace_level is ["OFF"] and the other keys keep Triton's defaults; an update
may restate them (or reset a key with null / an empty value), and one that turns tracing on or
changes a key answers 501 / UNIMPLEMENTED saying so. A model's settings are the global ones.

Log settings, under Triton's names, are the server's log level and format (logs.py):
log_verbose_level 1 / log_info / log_warning / log_error say which of debug / info / warning /
error records are written. boundgen logs by level, each level with every more severe one, so
an update sets the most verbose kind turned on (log_verbose_level > 0 is debug) and refuses to
turn off a kind that level writes. log_format is boundgen's "text" or "json"; log_file is ""
(stderr; another file answers 501). A change applies to the process at once (logs.configure).
"""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Sequence

from google.protobuf import json_format

from boundgen.errors import InvalidInput
from boundgen.server.logs import FORMATS, LEVELS, LogSettings
from boundgen.server.models import DRAINING, LOADING, ModelSet
from boundgen.server.served import PLATFORM, VERSION, ServedModel, engine_contexts
from boundgen.server.status import Unsupported

NS = 1_000_000_000


def _data_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_config(model: ServedModel) -> dict:
    spec = model.engine.spec
    kind = "KIND_GPU" if spec.device.startswith("cuda") else "KIND_CPU"
    # The program's bounds, then how this server serves it: its admission bounds (a replica front
    # end sizes its own from them, server/deploy/replicas.py) and the artifact it was loaded from, by its
    # directory's name only: where the server keeps its files is no client's business.
    served = {"max_inflight": model.admission.max_inflight, "max_queue": model.admission.max_queue}
    if model.source:
        served["artifact"] = PurePath(model.source).name
    parameters = {key: {"string_value": value if isinstance(value, str) else json.dumps(value)}
                  for key, value in {**model.signature.parameters(), **served}.items()}
    config = {
        "name": model.name, "platform": PLATFORM, "max_batch_size": 0,
        "input": [{"name": t.name, "data_type": _data_type(t.datatype), "dims": list(t.shape)}
                  for t in model.signature.inputs],
        "output": [{"name": t.name, "data_type": _data_type(t.datatype), "dims": list(t.shape)}
                   for t in model.signature.outputs],
        "instance_group": [{"name": model.name, "kind": kind, "count": engine_contexts(model.engine)}],
        "parameters": parameters,
    }
    if spec.runtime.batching:  # concurrent requests share model calls; a free context never waits
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 0}
    return config


def _duration(count_seconds: tuple[int, float]) -> dict:
    count, seconds = count_seconds
    return {"count": int(count), "ns": int(round(seconds * NS))}


def _one_model_statistics(models: ModelSet, name: str) -> dict:
    totals = models.metrics.phase_totals(name)
    none = (0, 0.0)
    pre, post, compute = totals.get("pre", none), totals.get("post", none), totals["compute"]
    infer = (compute[0], max(0.0, compute[1] - pre[1] - post[1]))
    last = models.metrics.last_success(name)
    return {
        "name": name, "version": VERSION, "last_inference": 0 if last is None else int(last * 1000),
        "inference_count": totals["success"][0], "execution_count": compute[0],
        "inference_stats": {"success": _duration(totals["success"]), "fail": _duration(totals["fail"]),
                            "queue": _duration(totals["queue"]), "compute_input": _duration(pre),
                            "compute_infer": _duration(infer), "compute_output": _duration(post),
                            "cache_hit": _duration(none), "cache_miss": _duration(none)},
    }


def model_statistics(models: ModelSet, name: str = "", version: str = "") -> dict:
    """Statistics of one model, or of every model when `name` is empty (Triton's answer shape)."""
    names = [models.get(name, version).name] if name else sorted(models.models)
    return {"model_stats": [_one_model_statistics(models, n) for n in names]}


def repository_index(models: ModelSet, ready_only: bool = False, loadable: Sequence[str] = ()) -> list[dict]:
    """The models this server holds and their state (READY, LOADING while the server loads,
    UNAVAILABLE while it drains), then the model repository's artifacts it does not serve
    (`loadable`, with --model-repository: UNAVAILABLE until loaded, as Triton lists them); with
    `ready_only`, only those that take requests."""
    state, reason = {LOADING: ("LOADING", "the server is still loading its models"),
                     DRAINING: ("UNAVAILABLE", "the server is shutting down")}.get(models.state, ("READY", ""))
    served = [{"name": n, "version": VERSION, "state": state, "reason": reason} for n in sorted(models.models)]
    unserved = [{"name": n, "state": "UNAVAILABLE", "reason": "not loaded: POST /v2/repository/models/"
                 f"{n}/load serves it"} for n in loadable if n not in models.models]
    return [m for m in served + unserved if not ready_only or m["state"] == "READY"]


TRACE = {"trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"], "log_frequency": ["0"],
         "trace_file": [""], "trace_mode": ["triton"]}  # Triton's defaults; nothing is traced


def trace_settings(update: dict | None = None) -> dict:
    """The trace settings (HTTP JSON: trace_level a list, the others strings), after checking
    `update` (key -> list of strings, or None / [] to reset) changes nothing."""
    shown = {key: value if key == "trace_level" else value[0] for key, value in TRACE.items()}
    for key, value in (update or {}).items():
        value = value if value is None or isinstance(value, list) else [value]  # HTTP: a scalar, or a list
        value = value and [str(v) for v in value]
        if key not in TRACE:
            raise InvalidInput(f"unknown trace setting {key!r}; the settings are {', '.join(TRACE)}")
        if value and value != TRACE[key]:
            raise Unsupported(f"this server does not trace requests, so {key} stays {shown[key]} (asked for "
                              f"{value}); per-request timings are in /metrics and the model statistics")
    return shown


LOG_KINDS = {"log_verbose_level": "debug", "log_info": "info", "log_warning": "warning", "log_error": "error"}


def log_settings(settings: LogSettings | None) -> dict:
    """The server's logging under Triton's names (see the module docstring); None: a server whose
    logging is not one process's (Ray Serve replicas each log on their own)."""
    if settings is None:
        raise Unsupported("log settings are not served here: each replica logs on its own; set --log-level and "
                          "--log-format when starting serve")
    level = LEVELS.index(settings.level)
    on = {key: LEVELS.index(kind) >= level for key, kind in LOG_KINDS.items()}
    return {"log_file": "", "log_info": on["log_info"], "log_warning": on["log_warning"], "log_error": True,
            "log_verbose_level": int(on["log_verbose_level"]), "log_format": settings.format}


def update_log_settings(settings: LogSettings | None, update: dict) -> dict:
    """Apply Triton's log settings `update` (null values change nothing) to `settings`; the new settings."""
    current = log_settings(settings)
    update = {key: value for key, value in update.items() if value is not None}
    for key, value in update.items():
        if key == "log_verbose_level":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"log_verbose_level must be a non-negative integer, got {value!r}")
        elif key in LOG_KINDS:
            if not isinstance(value, bool):
                raise InvalidInput(f"{key} must be true or false, got {value!r}")
        elif key == "log_format":
            if value not in FORMATS:
                raise InvalidInput(f"log_format must be one of boundgen's formats {', '.join(FORMATS)}, got {value!r}")
        elif key == "log_file":
            if value != "":
                raise Unsupported(f"log_file cannot be set (asked for {value!r}): the server logs to its stderr; "
                                  "redirect that")
        else:
            raise InvalidInput(f"unknown log setting {key!r}; the settings are {', '.join(current)}")
    merged = {**current, **update}
    level = next((kind for key, kind in LOG_KINDS.items() if merged[key]), "error")
    for key, kind in LOG_KINDS.items():
        if key in update and not update[key] and LEVELS.index(kind) >= LEVELS.index(level):
            raise InvalidInput(f"{key} cannot be off while {level} records are written: boundgen logs by level "
                               f"({', '.join(LEVELS)}), each with every more severe kind")
    if settings.fixed and (level, merged["log_format"]) != (settings.level, settings.format):
        raise Unsupported(f"log settings cannot change while this server runs: {settings.fixed}")
    settings.level, settings.format = level, merged["log_format"]
    settings.apply()
    return log_settings(settings)


def to_message(obj: dict, message):
    """Fill the gRPC `message` from its Triton JSON form (protobuf's JSON mapping)."""
    return json_format.ParseDict(obj, message)
