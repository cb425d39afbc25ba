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
