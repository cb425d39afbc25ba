#!/usr/bin/env bash
# Creates .venv/ at the repo root and installs boundgen with its pinned dependencies.
# Idempotent: does nothing when requirements.txt and pyproject.toml are unchanged since the last run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=.venv/.boundgen-setup
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] installing pinned requirements into .venv (torch CPU wheel, triton, transformers, ...)"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -e .
echo "$want" > "$stamp"
echo "[setup] done"
