#!/usr/bin/env bash
# pyenv.sh: makes the Python test environment (build/venv) with the pinned
# torch (CPU wheel), triton, redis-py, pytest, numpy and transformers (a real
# architecture built from a small config; nothing is downloaded), and
# installs the kcache package from python/ into it. Idempotent: an environment that already has
# the pins only gets kcache reinstalled when python/ or client/ changed.
# usage: scripts/pyenv.sh [VENV]   (default build/venv); prints the venv path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv}
# torch: ONLY this exact pin (any other version resolves to a CUDA wheel of
# several GB); triton pinned as the GPU machine's.
pins=(torch==2.13.0 triton==3.6.0 redis==8.1.0 pytest==9.2.0 numpy==2.4.6
      transformers==5.23.0 ruff==0.17.5)
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" >&2
fi
stamp="$venv/.kcache-pins"
if [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
  "$venv/bin/python" -m pip install -q "${pins[@]}" >&2
  echo "${pins[*]}" >"$stamp"
fi
# kcache: rebuilt when its sources are newer than the installed copy
mark="$venv/.kcache-installed"
if [ ! -f "$mark" ] || [ -n "$(find python client schema gpu CMakeLists.txt \
     -newer "$mark" -type f -print -quit)" ]; then
  "$venv/bin/python" -m pip install -q ./python >&2
  touch "$mark"
fi
echo "$venv"
