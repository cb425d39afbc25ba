"""Constrained-beam requests and catalogue loads checked before they reach an engine (found by an
adversarial round on the catalogue routes, 2026-12-07): a subset name holding a lone surrogate,
a repository name too long for the file system, a catalogue load while the server drains.
Each was a 500 with a traceback, or went through; each is now the error the contract names."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from boundgen.artifact.program import BeamSpec
from boundgen.errors import ConfigError, InvalidInput
from boundgen.runtime.engine import EngineSpec
from boundgen.server.kserve.repository import Repository
from boundgen.server.signature import Signature
from boundgen.server.status import Unavailable

CBEAM = EngineSpec("cbeam", BeamSpec(width=3, steps=2, max_prompt_tokens=8, stop_token_ids=(7,), constrained=True))


def test_a_subset_name_with_a_lone_surrogate_is_invalid_input():
    """It crossed to the engine process as text: a UnicodeEncodeError there, a 500 behind front ends only."""
    signature = Signature(CBEAM)
    call = signature.call([b"a prompt"])
    with pytest.raises(InvalidInput, match="ALLOW_SUBSET is not valid UTF-8 text: it holds a lone surrogate"):
        signature.allowing(call, subset="\ud800")
    assert signature.allowing(call, subset="shoes").allow_subset == "shoes"


def repository(tmp_path, state: str = "ready") -> Repository:
    engine = SimpleNamespace(load_catalogue=lambda path: pytest.fail("the catalogue was loaded"))
    models = SimpleNamespace(state=state, get=lambda name: SimpleNamespace(engine=engine))
    return Repository(models, tmp_path, load_engine=None, drain_timeout_s=1.0, say=lambda message: None)


def test_a_name_too_long_for_the_file_system_is_invalid_input(tmp_path):
    """is_dir() raised ENAMETOOLONG: a 500 for a model or catalogue name of 300 letters."""
    with pytest.raises(InvalidInput, match="cannot be read: File name too long"):
        repository(tmp_path).artifact_dir("y" * 300)


def test_a_catalogue_load_while_draining_is_unavailable(tmp_path):
    """It swapped the catalogue under the requests still draining, where a model load is refused 503."""
    (tmp_path / "c").mkdir()
    with pytest.raises(Unavailable, match="cannot load a catalogue for cbeam now: the server is draining"):
        asyncio.run(repository(tmp_path, "draining").load_catalogue("cbeam", "c"))


def test_a_model_loaded_again_keeps_the_catalogue_loaded_last_where_it_fits(tmp_path):
    """A plain load brought back `serve --catalogue`'s catalogue; where the one loaded last does not fit the
    new artifact, the model keeps its start catalogue and the log says so."""
    said, loaded = [], []
    repo = Repository(SimpleNamespace(state="ready"), tmp_path, load_engine=None, drain_timeout_s=1.0,
                      say=said.append)
    repo.catalogues["cbeam"] = tmp_path / "c2"
    asyncio.run(repo._keep_catalogue("cbeam", SimpleNamespace(load_catalogue=loaded.append)))
    assert loaded == [tmp_path / "c2"] and said[-1] == "boundgen serve: the new cbeam keeps catalogue c2"

    def misfit(path):
        raise ConfigError("a node of the catalogue has 9 children; this artifact looks up at most 4")

    asyncio.run(repo._keep_catalogue("cbeam", SimpleNamespace(load_catalogue=misfit)))
    assert "catalogue c2 does not fit the new cbeam (a node of the catalogue has 9 children" in said[-1]
    assert "it serves the catalogue it was started with" in said[-1] and "cbeam" not in repo.catalogues
    asyncio.run(repo._keep_catalogue("cbeam", SimpleNamespace(load_catalogue=loaded.append)))  # nothing to keep
    assert loaded == [tmp_path / "c2"]
