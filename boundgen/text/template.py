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

    @property
    def is_identity(self) -> bool:
        return self.pattern == PLACEHOLDER

    def render(self, text: str) -> str:
        return text if self.is_identity else self.pattern.replace(PLACEHOLDER, text)
