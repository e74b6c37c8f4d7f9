#!/bin/sh
# run.sh VENV ARGS...: pytest of tests/python in the virtual environment
# scripts/pyenv.sh makes. No environment: a failure when CI=true (the tests
# must run there), else skipped (exit 77, ctest's SKIP_RETURN_CODE).
venv=$1
shift
if [ ! -x "$venv/bin/python" ]; then
  echo "tests/python: no virtual environment at $venv (scripts/pyenv.sh makes it)"
  [ "$CI" = "true" ] && exit 1
  exit 77
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
