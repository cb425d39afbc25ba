"""The contract between compiling an artifact and serving it (no torch at import).

- program.py: what a program is built for (ScoreSpec, BeamSpec: task parameters and shape
  bounds), defined once; CLI flags, deploy-file keys and server metadata derive from them.
- tensors.py: the compiled programs' tensor names, the beam stage protocol and its state.
- manifest.py: the typed, versioned manifest.json the compiler writes and the runtime reads.
"""
