"""Deployment topologies of `boundgen serve`: front-end processes around one engine process."""
