"""Prompt templates: fixed text around each sample, with a `{text}` placeholder.

Only the literal `{text}` is substituted; other braces are kept as written, so a template may
contain JSON or code without escaping.
"""

from __future__ import annotations

from dataclasses import dataclass

from boundgen.errors import ConfigError

PLACEHOLDER = "{text}"


@dataclass(frozen=True)
class Template:
    pattern: str = PLACEHOLDER

    def __post_init__(self):
        if not isinstance(self.pattern, str) or PLACEHOLDER not in self.pattern:
            raise ConfigError(f"template {self.pattern!r} has no {PLACEHOLDER} placeholder; "
                              f"write where the sample goes, e.g. 'Query: {PLACEHOLDER}\\nRelevant:'")
        if not self.pattern.isascii():  # a command line's bytes that were not UTF-8 (lone surrogates)
            try:
                self.pattern.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ConfigError(f"template {self.pattern!r} is not valid UTF-8 text: it holds a lone surrogate "
                                  f"at character {exc.start}") from None

    @property
    def is_identity(self) -> bool:
        return self.pattern == PLACEHOLDER

    def render(self, text: str) -> str:
        return text if self.is_identity else self.pattern.replace(PLACEHOLDER, text)
