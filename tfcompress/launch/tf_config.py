"""The workers' addresses: free ports, each worker's ``TF_CONFIG`` and environment."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Mapping, Sequence

__all__ = ["LOCALHOST", "free_ports", "make_tf_config", "worker_env"]

LOCALHOST = "127.0.0.1"


def free_ports(n: int, host: str = LOCALHOST) -> list[int]:
    """Finds ``n`` distinct TCP ports that are free right now.

    All sockets are held open until every port is chosen, so the ports are distinct.
    Another process may still take one before a worker binds it; that race is
    inherent to choosing ports up front, as TensorFlow's own multi-worker tests do.

    Args:
        n: How many ports.
        host: Interface to bind.

    Returns:
        ``n`` distinct port numbers.

    Raises:
        ValueError: If ``n`` is negative.

    >>> ports = free_ports(3)
    >>> len(set(ports))
    3
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with contextlib.ExitStack() as sockets:
        ports = []
        for _ in range(n):
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return ports


def make_tf_config(
    ports: Sequence[int],
    index: int,
    host: str = LOCALHOST,
    *,
    hosts: Sequence[str] | None = None,
) -> dict:
    """Builds the ``TF_CONFIG`` of one worker in a local cluster.

    Args:
        ports: One port per worker; worker ``i`` listens on ``host:ports[i]``.
        index: This worker's index.
        host: Address every worker listens on.
        hosts: One address per worker instead of ``host``.

    Returns:
        The ``TF_CONFIG`` dictionary (``json.dumps`` it into the environment).

    Raises:
        ValueError: If ``index`` is not a valid worker index, or ``hosts`` has the
            wrong length.

    >>> make_tf_config([2222, 2223], 1)
    {'cluster': {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']}, 'task': {'type': 'worker', 'index': 1}}
    >>> make_tf_config([2222, 2222], 0, hosts=["10.0.0.1", "10.0.0.2"])["cluster"]
    {'worker': ['10.0.0.1:2222', '10.0.0.2:2222']}
    """
    if not 0 <= index < len(ports):
        raise ValueError(f"index must be in [0, {len(ports)}), got {index}")
    hosts = [host] * len(ports) if hosts is None else list(hosts)
    if len(hosts) != len(ports):
        raise ValueError(f"need {len(ports)} hosts, got {len(hosts)}")
    return {
        "cluster": {"worker": [f"{h}:{port}" for h, port in zip(hosts, ports, strict=True)]},
        "task": {"type": "worker", "index": index},
    }


def worker_env(
    extra: Mapping[str, str] | None, ports: Sequence[int], hosts: Sequence[str], index: int
) -> dict:
    """Worker ``index``'s environment: this process's, ``extra``, its ``TF_CONFIG`` and index."""
    worker_env = dict(os.environ)
    worker_env.update(extra or {})
    worker_env.setdefault("PYTHONUNBUFFERED", "1")
    worker_env["TF_CONFIG"] = json.dumps(make_tf_config(ports, index, hosts=hosts))
    worker_env["TFCOMPRESS_WORKER_INDEX"] = str(index)
    worker_env["TFCOMPRESS_NUM_WORKERS"] = str(len(ports))
    return worker_env
