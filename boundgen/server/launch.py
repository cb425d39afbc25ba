"""The old path of server/deploy/launch.py, kept for code that starts a server this way
(docs/serving.md showed `from boundgen.server.launch import ServerProcess`). No part of the
core: nothing in boundgen imports it (tests/test_layers.py)."""

from boundgen.server.deploy.launch import ServerProcess, free_port

__all__ = ["ServerProcess", "free_port"]
