#!/usr/bin/env bash
# Sets up .venv/ and runs the CPU test lane (the same command CI runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
