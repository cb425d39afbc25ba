#!/usr/bin/env bash
# Sets up .venv/ and runs the demo on CPU: a tiny random-weight Qwen3 checkpoint with the real
# Qwen vocabulary, built, served and queried.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/boundgen demo "$@"
