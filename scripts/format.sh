#!/usr/bin/env bash
# format.sh: the C style of kcache (.clang-format: LLVM's, includes left in
# their order) over every tracked .c and .h file, with Debian 12's
# clang-format (14).
#   scripts/format.sh           rewrites the files in place
#   scripts/format.sh --check   changes nothing; lists the files that differ
#                               and exits 1 (scripts/test.sh runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || {
  echo "format.sh: clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
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
  exit 0
fi
clang-format -i "${files[@]}"
