#!/usr/bin/env bash
# format.sh: the style of kcache: C (.clang-format: LLVM's, includes left in
# their order) over every tracked .c and .h file, with Debian 12's
# clang-format (14); Python (ruff.toml: ruff's formatter, and its linter for
# mistakes) over every tracked .py file, with the ruff of the test venv
# (scripts/pyenv.sh pins it; RUFF=path to use another).
#   scripts/format.sh           rewrites the files in place
#   scripts/format.sh --check   changes nothing; lists the files that differ
#                               or fail the linter, and exits 1
#                               (scripts/test.sh runs this)
# Without a ruff the Python part is skipped with a line saying so, unless
# CI=true: then it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
  echo "format.sh: clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
}
ruff=${RUFF:-build/venv/bin/ruff}
mapfile -t pyfiles < <(git ls-files '*.py')
python_style() { # --check or nothing
  if [ ! -x "$ruff" ]; then
    echo "format.sh: no ruff at $ruff (scripts/pyenv.sh): Python not checked" >&2
    [ "${CI:-}" != true ] || exit 1
    return 0
  fi
  if [ "${1:-}" = --check ]; then
    "$ruff" format --check --quiet "${pyfiles[@]}" &&
      "$ruff" check --quiet "${pyfiles[@]}" || {
      echo "format.sh: Python not in the style of ruff.toml (run scripts/format.sh)" >&2
      exit 1
    }
  else
    "$ruff" format --quiet "${pyfiles[@]}"
    "$ruff" check --quiet --fix "${pyfiles[@]}"
  fi
}
mapfile -t files < <(git ls-files '*.c' '*.h')
if [ "${1:-}" = --check ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "format.sh: not in the style of .clang-format (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  python_style --check
  exit 0
fi
clang-format -i "${files[@]}"
python_style
