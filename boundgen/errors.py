"""Errors a user can cause, each with a message in the user's terms.

`BoundgenError` is the root: the CLI prints its message without a traceback and exits 2;
the server maps `InvalidInput` to 400 / INVALID_ARGUMENT.
"""


class BoundgenError(Exception):
    """An error caused by input, configuration or files, explained by its message."""


class InvalidInput(BoundgenError):
    """A request that cannot be served as given (empty, too long, wrong type, out of bounds)."""


class ConfigError(BoundgenError):
    """A checkpoint, deployment file or build option we cannot honour."""


class ArtifactError(BoundgenError):
    """An artifact directory that is missing, incomplete, tampered with or built for another target."""
