#!/usr/bin/env bash
# run.sh: the main job. Installs what is needed, builds, starts kcached on
# ./kcache-data and warms the example model against it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
echo "run.sh: built; kcached and kcache land with their modules" >&2
