"""The workers' addresses: free ports, each task's ``TF_CONFIG`` and environment.

One builder, :func:`cluster_tf_config`, makes every ``TF_CONFIG``: the
launcher's local workers (:func:`make_tf_config`) and the machines of a real
cluster (``tfcompress tf-config``, :mod:`tfcompress.launch.tf_config_command`),
whose ``host:port`` strings :func:`parse_address` checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence

__all__ = [
    "LOCALHOST",
    "TASK_TYPES",
    "cluster_tf_config",
    "free_ports",
    "make_tf_config",
    "parse_address",
    "worker_env",
]

LOCALHOST = "127.0.0.1"

#: The task types ``cluster_tf_config`` writes: MultiWorkerMirroredStrategy's.
TASK_TYPES = ("chief", "worker")

# A host name or IPv4 address (letters, digits, '.', '-', '_'), or an IPv6 address
# in brackets, as gRPC writes it: "[::1]".
_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")


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
    hosts = [host] * len(ports) if hosts is None else list(hosts)
    if len(hosts) != len(ports):
        raise ValueError(f"need {len(ports)} hosts, got {len(hosts)}")
    workers = [f"{h}:{port}" for h, port in zip(hosts, ports, strict=True)]
    return cluster_tf_config(workers, index)


def cluster_tf_config(
    workers: Sequence[str],
    index: int,
    *,
    chief: str | None = None,
    task_type: str = "worker",
) -> dict:
    """Builds the ``TF_CONFIG`` of one task of a cluster of workers and an optional chief.

    Args:
        workers: Each worker's ``host:port``, in task order.
        index: The task's index among the tasks of its type (0 for the chief).
        chief: The chief's ``host:port``, or ``None`` for a cluster of workers only
            (worker 0 is then the chief).
        task_type: ``"worker"`` or ``"chief"``: which task this ``TF_CONFIG`` is for.

    Returns:
        The ``TF_CONFIG`` dictionary (``json.dumps`` it into the environment).

    Raises:
        ValueError: If ``task_type`` is unknown, ``"chief"`` without ``chief``, or
            ``index`` is not an index of that type's tasks.

    >>> cluster_tf_config(["h1:2222", "h2:2222"], 0, chief="h0:2222")
    {'cluster': {'chief': ['h0:2222'], 'worker': ['h1:2222', 'h2:2222']}, 'task': {'type': 'worker', 'index': 0}}
    """
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if task_type == "chief" and chief is None:
        raise ValueError("task_type 'chief' needs a chief address")
    count = 1 if task_type == "chief" else len(workers)
    if not 0 <= index < count:
        raise ValueError(f"index must be in [0, {count}), got {index}")
    cluster = {} if chief is None else {"chief": [chief]}
    cluster["worker"] = list(workers)
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def parse_address(text: str) -> tuple[str, int]:
    """Splits and checks one ``host:port`` of a cluster.

    Args:
        text: ``host:port``; the host a name or IPv4 address, or an IPv6 address in
            brackets (``[fd00::1]:2222``).

    Returns:
        The host and the port.

    Raises:
        ValueError: If the port is missing or not in [1, 65535], or the host is empty
            or not a host name or address; the message quotes ``text``.

    >>> parse_address("worker-0.example.com:2222")
    ('worker-0.example.com', 2222)
    >>> parse_address("[::1]:2222")
    ('[::1]', 2222)
    """
    host, colon, port_text = text.strip().rpartition(":")
    if not colon or not port_text:
        raise ValueError(f"{text!r} has no port (write host:port, e.g. host1:2222)")
    if not host:
        raise ValueError(f"{text!r} has an empty host (write host:port, e.g. host1:2222)")
    if not re.fullmatch(r"[0-9]+", port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number in [1, 65535], got {port_text!r}")
    if not _HOST.fullmatch(host):
        raise ValueError(
            f"{text!r}: {host!r} is not a host name or address (an IPv6 address goes "
            "in brackets: [fd00::1]:2222)"
        )
    return host, int(port_text)


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
