"""boundgen: an inference engine for bounded generation with small Qwen2/Qwen3 models.

See docs/architecture.md for the layers: server/ runtime/ text/ programs/ model/ ops/ compile/
artifact/ bench/.
"""

from boundgen.version import __version__  # noqa: F401


def load(artifact_dir, **kwargs):
    """Load a built artifact directory and return an engine with `score(texts)` or `beam(text)`."""
    # Lazy: `import boundgen` (the CLI's --help, the artifact contract) must not import torch.
    from boundgen.runtime.loading import load_artifact_engine

    return load_artifact_engine(artifact_dir, **kwargs)
