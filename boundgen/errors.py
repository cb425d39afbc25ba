"""Errors a user can cause, each with a message in the user's terms.

`BoundgenError` is the root: the CLI prints its message without a traceback and exits 2;
the server maps `InvalidInput` to 400 / INVALID_ARGUMENT, `Overloaded` to 429 / RESOURCE_EXHAUSTED
and `DeadlineExceeded` to 504 / DEADLINE_EXCEEDED (boundgen/server/status.py). `Cancelled`
reaches no client: the server raises it only for a request whose client has gone.
"""


def repeated_keys(pairs: list) -> list[str]:
    """The keys a JSON object's members give more than once, sorted (json.loads keeps the last one
    silently): what the readers of our own JSON refuse, through their object_pairs_hook."""
    keys = [k for k, _ in pairs]
    return sorted({k for k in keys if keys.count(k) > 1})


def shown(value, limit: int = 80) -> str:
    """A client's value in an error message, cut short (a model name of 200,000 characters made a
    200 KB answer): its repr to `limit` characters, a list or an object by its kind alone."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {len(str(value))}-digit number"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class BoundgenError(Exception):
    """An error caused by input, configuration or files, explained by its message."""


class InvalidInput(BoundgenError):
    """A request that cannot be served as given (empty, too long, wrong type, out of bounds)."""


class WrongTask(InvalidInput, NotImplementedError):
    """A call of the other task's method: `score` on a beam model, `beam` on a score model, token ids
    where the model takes none. (A NotImplementedError too, as the Engine interface raised before.)"""


class EngineClosed(BoundgenError, RuntimeError):
    """A call on an engine after its `close()`. (A RuntimeError too, as raised before.)"""


class DeadlineExceeded(BoundgenError):
    """A request whose deadline (`time.monotonic()` seconds) passed before the engine could run it;
    it was not run. Raised by `Engine.score` / `Engine.beam` when given a deadline."""


class Overloaded(BoundgenError):
    """A request refused because the queue it would wait in was full; it was not run.
    `client_waiting`: requests its client had waiting in that queue when it was refused (a
    server holds such a refusal back: server/admission.py)."""

    client_waiting = 0


class Cancelled(BoundgenError):
    """A request whose caller gave it up (set its `cancelled` event) before the engine could run
    it; it was not run. Raised by `Engine.score` / `Engine.beam` when given a `cancelled` event."""


class ConfigError(BoundgenError):
    """A checkpoint, deployment file or build option we cannot honour."""


class ArtifactError(BoundgenError):
    """An artifact directory that is missing, incomplete, tampered with or built for another target."""
