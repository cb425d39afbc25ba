"""The package version (a leaf: what records versions imports it without the rest of boundgen)."""

__version__ = "0.1.0"
