"""Real engines for server tests: the eager engine over a tiny demo checkpoint (no compile),
described by an `eager.json` in a directory that stands in for an artifact."""

from __future__ import annotations

import json
from pathlib import Path


def write_eager_artifact(directory: Path, model_dir: Path, spec: dict, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "eager.json").write_text(json.dumps({"model_dir": str(model_dir), "spec": spec, "name": name}))
    return directory


def eager_engine_from_config(config: dict, **runtime):
    """`runtime`: RuntimeConfig fields (serve's runtime flags) over its defaults."""
    from boundgen.artifact.manifest import RuntimeConfig
    from boundgen.artifact.program import spec_from_dict
    from boundgen.programs.eager import eager_engine

    return eager_engine(config["model_dir"], spec_from_dict(config["spec"]), name=config["name"],
                        runtime=RuntimeConfig().replace(**runtime))
