"""``python -m tfcompress``: the ``tfcompress`` command (:mod:`tfcompress.cli`)."""

import sys

from tfcompress.cli import main

if __name__ == "__main__":
    sys.exit(main())
