"""Print one machine's TF_CONFIG for a cluster of several machines.

``tfcompress tf-config`` writes the ``TF_CONFIG`` that task ``I`` of a
multi-machine cluster needs, so that nobody writes that JSON by hand (Horovod
users pass ``-H host1,host2``)::

    tfcompress tf-config --workers host1:2222,host2:2222 --index 1
    eval "$(tfcompress tf-config --workers host1:2222,host2:2222 --index 1 --export)"
    tfcompress tf-config --chief host0:2222 --workers host1:2222 --task-type chief

Every machine gets the same ``--workers`` (and ``--chief``) and its own
``--index``: its position in ``--workers``, from 0. With ``--chief``, that task
is the chief (``--task-type chief`` on its machine) and the workers are counted
from 0 after it. The ``TF_CONFIG`` is the one the launcher gives its local
workers, from the same builder (:func:`~tfcompress.launch.tf_config.cluster_tf_config`).
A bad address (no port, a port outside [1, 65535], an empty host, an entry given
twice) or an index outside the cluster ends the command with its usage and one
line naming the option, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from tfcompress.launch import arguments
from tfcompress.launch.tf_config import TASK_TYPES, cluster_tf_config

__all__ = ["configure_parser", "run_from_args"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Adds the ``tf-config`` options to ``parser``.

    Args:
        parser: The parser of ``tfcompress tf-config``; :func:`run_from_args` reports
            bad combinations of options with its ``error`` (exit status 2).
    """
    parser.set_defaults(usage_error=parser.error)
    parser.add_argument(
        "--workers",
        type=arguments.address_list,
        required=True,
        metavar="HOST:PORT,...",
        help="every worker's address, in task order, the same on every machine",
    )
    parser.add_argument(
        "--index",
        type=arguments.non_negative_int,
        default=None,
        metavar="I",
        help="this machine's position in --workers, from 0 (required for a worker)",
    )
    parser.add_argument(
        "--chief",
        type=arguments.address,
        default=None,
        metavar="HOST:PORT",
        help="a chief task's address (default: none; worker 0 is then the chief)",
    )
    parser.add_argument(
        "--task-type",
        choices=TASK_TYPES,
        default="worker",
        help="whether this machine runs a worker (default) or the --chief task",
    )
    parser.add_argument(
        "--export",
        action="store_true",
        help="print a shell line, export TF_CONFIG='...', instead of the JSON alone",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Prints the ``TF_CONFIG`` described by parsed command-line arguments.

    Args:
        args: Namespace from a parser set up by :func:`configure_parser`.

    Returns:
        0; 2 on a bad combination of options when ``args`` has no ``usage_error``
        (else that exits 2 with the usage).
    """
    workers = list(args.workers)
    index = args.index
    if args.task_type == "chief":
        if args.chief is None:
            return _usage_error(args, "--task-type chief needs --chief HOST:PORT")
        if index not in (None, 0):
            return _usage_error(args, f"--index {index}: the chief task's index is 0")
        index = 0
    elif index is None:
        return _usage_error(args, "--index is required: this machine's position in --workers")
    elif index >= len(workers):
        return _usage_error(
            args,
            f"--index {index}: --workers lists {len(workers)} worker(s), "
            f"so --index goes from 0 to {len(workers) - 1}",
        )
    if args.chief is not None and args.chief in workers:
        return _usage_error(
            args,
            f"--chief {args.chief} is also in --workers (entry {workers.index(args.chief) + 1}): "
            "each task needs an address of its own",
        )
    config = cluster_tf_config(workers, index, chief=args.chief, task_type=args.task_type)
    text = json.dumps(config)
    print(f"export TF_CONFIG={shlex.quote(text)}" if args.export else text)
    return 0


def _usage_error(args: argparse.Namespace, message: str) -> int:
    """Reports a bad argument: the parser's usage and one line (exits 2), else one line."""
    usage_error = getattr(args, "usage_error", None)
    if usage_error is not None:
        usage_error(message)  # argparse's error: exits 2
    print(f"tfcompress tf-config: {message}", file=sys.stderr, flush=True)
    return 2
