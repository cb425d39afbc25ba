# Sourced by the GPU scripts, after `root=...` and `cd "$root"`: install this tree as the boundgen
# package of the machine's python (${PY:-python3}), as users install it, rather than pointing
# PYTHONPATH at it. The GPU image brings torch 2.11 / triton 3.6 and has no internet, so pip
# installs boundgen alone: --no-deps (the image's packages stay as they are), --no-build-isolation
# and --no-index (built with the image's setuptools, nothing downloaded), -e (the installed package
# is this tree, so processes started from any folder, replica workers included, import this code).
# PIP_BREAK_SYSTEM_PACKAGES: a python marked externally managed (PEP 668) still takes it; with
# --no-deps nothing but boundgen itself is written. Skipped when that python already imports
# boundgen from this tree. Where pip cannot install it (no setuptools >= 77, say) it says why on
# stderr and falls back to PYTHONPATH, so that the measurements still run.
_boundgen_py="${PY:-python3}"
if ! (cd / && "$_boundgen_py" -c 'import importlib.util as u, os, sys
s = u.find_spec("boundgen")
sys.exit(s is None or os.path.realpath(s.origin) != os.path.realpath(sys.argv[1]))' "$root/boundgen/__init__.py") \
    > /dev/null 2>&1; then
  if PIP_BREAK_SYSTEM_PACKAGES=1 "$_boundgen_py" -m pip install --quiet --no-deps --no-build-isolation --no-index \
      -e "$root" > /tmp/boundgen_pip_install.log 2>&1; then
    echo "[gpu_install] boundgen installed (editable) from $root for $_boundgen_py" >&2
  else
    echo "[gpu_install] pip could not install boundgen (/tmp/boundgen_pip_install.log); using PYTHONPATH=$root:" >&2
    tail -n 3 /tmp/boundgen_pip_install.log >&2
    export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
unset _boundgen_py
