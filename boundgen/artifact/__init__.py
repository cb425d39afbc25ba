"""The contract between compiling and serving: a leaf with no torch at import."""
