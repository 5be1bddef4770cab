#!/usr/bin/env bash
# Sets up a fresh machine for tfcompress: the offline Fashion-MNIST data
# (Debian's dataset-fashion-mnist), the pinned Python dependencies, tfcompress
# itself (editable), and the custom-op library compiled against the installed
# TensorFlow. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || [ ! -f /usr/include/zlib.h ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q dataset-fashion-mnist zlib1g-dev >/dev/null \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q dataset-fashion-mnist zlib1g-dev >/dev/null; }
fi
if ! command -v g++ >/dev/null; then
  echo "setup: g++ not found; the custom ops will fall back to their pure-TF reference" >&2
fi

python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,bench,dev]"
python -m tfcompress.ops build
