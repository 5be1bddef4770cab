#!/usr/bin/env bash
# Sets up a fresh machine for tfcompress: the offline Fashion-MNIST data
# (Debian's dataset-fashion-mnist), the pinned Python dependencies, tfcompress
# itself (editable), and the custom-op library compiled against the installed
# TensorFlow. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's bazel-bootstrap (4.2.3) and its mock rule repositories let
# tests/ops/test_bazel.py build an op library with Bazel offline (about a
# minute to install on 2 cores; docs/howto/build-the-ops.md).
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || [ ! -f /usr/include/zlib.h ] \
  || [ ! -d /usr/src/bazel-bootstrap/mock_repos ] || ! command -v bazel >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  PACKAGES="dataset-fashion-mnist zlib1g-dev bazel-bootstrap bazel-bootstrap-source"
  $SUDO apt-get install -y -q $PACKAGES >/dev/null \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q $PACKAGES >/dev/null; }
fi
if ! command -v g++ >/dev/null; then
  echo "setup: g++ not found; the custom ops will fall back to their pure-TF reference" >&2
fi

python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,bench,dev]"
python -m tfcompress.ops build
