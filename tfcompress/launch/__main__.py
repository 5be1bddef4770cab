"""``python -m tfcompress.launch -n N [--timeout S] [--max-restarts K] [--bandwidth RATE] -- CMD``.

The same as ``tfcompress launch``, for when the console script is not on ``PATH``.
"""

import argparse
import sys

from tfcompress.launch import launcher


def main() -> int:
    """Parses ``sys.argv`` and runs the launch.

    Returns:
        The exit status (see :func:`tfcompress.launch.launcher.run_from_args`).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfcompress.launch",
        description="Run a command as N local TensorFlow workers.",
    )
    launcher.configure_parser(parser)
    return launcher.run_from_args(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
