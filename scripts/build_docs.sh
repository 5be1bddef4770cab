#!/usr/bin/env bash
# Builds the API reference from the docstrings with pdoc into build/docs/api
# (git-ignored), or into the folder given as the first argument. Fails (exit 1,
# one line per problem) on a module that does not import or on any pdoc
# warning; scripts/build_docs.py says what is checked. tests/test_docs.py runs
# the same build, so CI fails on a broken docstring.
#   ./scripts/build_docs.sh            # then open build/docs/api/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/build_docs.py "$@"
