# Sourced by the GPU scripts: preload the system libstdc++, without which loading an AOTInductor
# package segfaults on the GPU image (docs/build.md); every process the script starts inherits it.
if [[ -z "${LD_PRELOAD:-}" ]]; then
  lib="$(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | awk '{print $NF}')"
  [[ -n "$lib" ]] && export LD_PRELOAD="$lib"
fi
