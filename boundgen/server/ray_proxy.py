"""The old path of server/deploy/ray_proxy.py, kept for Ray clusters started with
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=boundgen.server.ray_proxy.middlewares (docs/serving.md
said so before the move). No part of the core: nothing in boundgen imports it (tests/test_layers.py)."""

from boundgen.server.deploy.ray_proxy import middlewares

__all__ = ["middlewares"]
