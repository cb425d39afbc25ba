"""boundgen: an inference engine for bounded generation with small Qwen2/Qwen3 models.

See ARCHITECTURE in docs/ for the layers: server/ runtime/ text/ programs/ model/ ops/ build/ bench/.
"""

__version__ = "0.1.0"


def load(artifact_dir, **kwargs):
    """Load a built artifact directory and return an engine with `score(texts)` or `beam(text)`."""
    from boundgen.runtime.engine import load_engine

    return load_engine(artifact_dir, **kwargs)
