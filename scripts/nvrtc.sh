#!/usr/bin/env bash
# nvrtc.sh: makes sure kcache can find NVRTC. When the CUDA toolkit
# ($CUDA_HOME or /usr/local/cuda) has no libnvrtc (a new machine may carry
# the toolkit without it), installs NVIDIA's wheel nvidia-cuda-nvrtc from
# PyPI, pinned to the toolkit's CUDA version, into build/deps/nvrtc, and
# prints the line that points kcache at it:
#     eval "$(scripts/nvrtc.sh)"    # export KCACHE_NVRTC=.../libnvrtc.so.13
# Prints nothing when the toolkit has NVRTC or KCACHE_NVRTC is set already.
set -euo pipefail
cd "$(dirname "$0")/.."
pin=${KCACHE_NVRTC_PIN:-13.0.88} # CUDA 13.0, as the toolkit (nvcc 13.0)

[ -n "${KCACHE_NVRTC:-}" ] && exit 0
for home in "${CUDA_HOME:-}" /usr/local/cuda; do
  [ -n "$home" ] || continue
  for f in "$home"/lib64/libnvrtc.so*; do
    [ -e "$f" ] && exit 0
  done
done

dir=$PWD/build/deps/nvrtc
lib=$dir/nvidia/cu13/lib/libnvrtc.so.13
if [ ! -f "$lib" ]; then
  echo "nvrtc.sh: no NVRTC in the CUDA toolkit; installing nvidia-cuda-nvrtc==$pin into $dir" >&2
  python3 -m pip install -q --disable-pip-version-check --no-deps \
    --target "$dir" "nvidia-cuda-nvrtc==$pin" >&2
fi
[ -f "$lib" ] || { echo "nvrtc.sh: $lib is missing after the install" >&2; exit 1; }
echo "export KCACHE_NVRTC=$lib"
