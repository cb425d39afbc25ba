"""`boundgen serve`'s choice of front-end processes: a --catalogue model is served by several,
as any other; the flags that need one process refuse several, saying why."""

import argparse

import pytest

from boundgen.cli import serve
from boundgen.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    return parser.parse_args(["serve", "ART", *argv])


def test_a_catalogue_takes_several_front_ends():
    assert serve._frontends(parse("--catalogue", "cbeam=CAT", "--frontends", "2"), True) == 2


def test_a_catalogue_takes_the_default_front_ends(monkeypatch):
    monkeypatch.setattr("boundgen.server.deploy.frontends.usable_cores", lambda: 16)
    assert serve._frontends(parse("--catalogue", "cbeam=CAT"), True) == 4
    assert serve._frontends(parse(), True) == 4


@pytest.mark.parametrize("flag, why", [
    (["--model-repository", "DIR"], "a repository load, of an artifact or of a constrained model's catalogue"),
    (["--allow-client-shm"], "shared memory region is mapped by the process that serves it"),
])
def test_single_process_flags_refuse_several_front_ends_and_say_why(flag, why):
    with pytest.raises(ConfigError, match=f"--frontends 2 cannot be combined with {flag[0]} \\(") as err:
        serve._frontends(parse(*flag, "--catalogue", "cbeam=CAT", "--frontends", "2"), True)
    assert why in str(err.value) and "use --frontends 1" in str(err.value)
    assert serve._frontends(parse(*flag), True) == 1  # and the default is one process


@pytest.mark.parametrize("key", ["", "  ", " key", "key "])
def test_an_empty_or_blank_api_key_is_refused_from_the_environment_too(monkeypatch, key):
    """An empty BOUNDGEN_API_KEY (a secret that failed to be injected) served with no key at all,
    where --api-key "" was refused."""
    monkeypatch.setenv("BOUNDGEN_API_KEY", key)
    with pytest.raises(ConfigError, match="must not be empty, blank or begin or end with spaces"):
        serve.config_from_args(parse())
    with pytest.raises(ConfigError, match="must not be empty"):
        serve.config_from_args(parse("--api-key", key))
    monkeypatch.delenv("BOUNDGEN_API_KEY")
    assert serve.config_from_args(parse()).api_key is None
    monkeypatch.setenv("BOUNDGEN_API_KEY", "sesame")
    assert serve.config_from_args(parse()).api_key == "sesame"
