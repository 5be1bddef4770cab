"""Benchmarks on an existing cluster: this process is one worker of the ``TF_CONFIG`` cluster.

``tfcompress bench train`` and ``tfcompress bench aggregate`` normally start
their workers themselves (``--cluster local``: the launcher, loopback or
rate-limited network namespaces). With ``--cluster tf_config`` there is no
launcher: the command is started once on every machine of a cluster that
``TF_CONFIG`` describes, as any ``MultiWorkerMirroredStrategy`` program is,
with the same arguments everywhere, and runs the benchmark's worker program
(one process per variant or model, in the same order on every machine) as
this machine's task. The chief (the ``chief`` task, or ``worker`` 0 when the
cluster has no chief) collects the results and writes the table and plots;
the other tasks only take part.

TensorFlow is not imported here: ``TF_CONFIG`` is read as JSON, so that a
malformed one fails before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

__all__ = [
    "CLUSTER_MODES",
    "TF_CONFIG_LINK",
    "ClusterTask",
    "WorkerRun",
    "read_tf_config",
    "task_rank",
    "report_failure",
    "run_as_task",
]

#: ``--cluster`` values: ``local`` (the launcher starts every worker) or
#: ``tf_config`` (this process is one task of the cluster in ``TF_CONFIG``).
CLUSTER_MODES: tuple[str, ...] = ("local", "tf_config")

#: The link column of rows measured with ``--cluster tf_config`` and no declared rate.
TF_CONFIG_LINK = "tf_config"

# MultiWorkerMirroredStrategy trains on these task types only.
_TRAINING_JOBS = ("chief", "worker")


class ClusterTask(NamedTuple):
    """This process's place in the ``TF_CONFIG`` cluster.

    Attributes:
      task_type: ``"chief"`` or ``"worker"``.
      task_index: the index within ``task_type``.
      num_workers: tasks that train: chief and workers together.
      is_chief: whether this task writes the results (the chief, else worker 0).
    """

    task_type: str
    task_index: int
    num_workers: int
    is_chief: bool


def read_tf_config(environ: Mapping[str, str] | None = None) -> ClusterTask:
    """Reads and checks ``TF_CONFIG`` the way ``MultiWorkerMirroredStrategy`` uses it.

    Args:
      environ: where to read ``TF_CONFIG``; ``os.environ`` when ``None``.

    Returns:
      This task's type, index, the number of training tasks and whether it is
      the chief.

    Raises:
      ValueError: ``TF_CONFIG`` unset, not JSON, without ``cluster`` or
        ``task``, naming a task type other than ``chief`` and ``worker`` or
        one absent from ``cluster``, an index out of range, or a cluster of
        more than one chief.

    >>> config = {"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
    ...           "task": {"type": "worker", "index": 1}}
    >>> read_tf_config({"TF_CONFIG": json.dumps(config)})
    ClusterTask(task_type='worker', task_index=1, num_workers=2, is_chief=False)
    """
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    if not text.strip():
        raise ValueError(
            "--cluster tf_config: TF_CONFIG is not set; set it on every machine to "
            '\'{"cluster": {"worker": ["host1:port", ...]}, "task": {"type": "worker", '
            '"index": i}}\''
        )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--cluster tf_config: TF_CONFIG is not JSON ({error})") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ValueError("--cluster tf_config: TF_CONFIG needs a 'cluster' and a 'task' object")
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in _TRAINING_JOBS:
        raise ValueError(
            f"--cluster tf_config: task type {task_type!r}; the benchmarks run on "
            f"{' and '.join(map(repr, _TRAINING_JOBS))} tasks (MultiWorkerMirroredStrategy)"
        )
    sizes = {}
    for job in _TRAINING_JOBS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list):
            raise ValueError(f"--cluster tf_config: cluster[{job!r}] must be a list of host:port")
        sizes[job] = len(addresses)
    if sizes["chief"] > 1:
        raise ValueError(f"--cluster tf_config: {sizes['chief']} chief tasks; at most one")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < sizes[task_type]:
        raise ValueError(
            f"--cluster tf_config: task {task_type!r} index {index!r} is not in "
            f"[0, {sizes[task_type]}) (cluster[{task_type!r}] has {sizes[task_type]} addresses)"
        )
    is_chief = task_type == "chief" or (sizes["chief"] == 0 and index == 0)
    return ClusterTask(task_type, index, sizes["chief"] + sizes["worker"], is_chief)


def task_rank(task_type: str, task_index: int, has_chief: bool) -> int:
    """This task's place among the training tasks: the chief 0, then the workers in order.

    Without a chief, worker 0 is 0 and so the chief (it writes the results).

    >>> task_rank("chief", 0, True), task_rank("worker", 0, True), task_rank("worker", 0, False)
    (0, 1, 0)
    """
    if task_type == "chief":
        return 0
    return task_index + (1 if has_chief else 0)


class WorkerRun(NamedTuple):
    """How this task's worker program ended.

    Attributes:
      returncode: its exit status (124 when ``timeout`` stopped it).
      log: its output, stdout and stderr together.
      timed_out: whether ``timeout`` stopped it.
    """

    returncode: int
    log: str
    timed_out: bool


def run_as_task(
    command: Sequence[str],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
) -> WorkerRun:
    """Runs ``command`` as this machine's task, with this process's ``TF_CONFIG``.

    Every task runs the same commands in the same order; each one joins the
    cluster, runs, and leaves it when all tasks finish (TensorFlow's
    coordination service holds the tasks at a shutdown barrier), so the
    next command forms the cluster anew.

    Args:
      command: the program and its arguments.
      timeout: seconds it may run (then its process group is killed); ``None``: no limit.
      env: variables added to this process's environment.
      echo: called with each line of its output as it arrives; ``None``: kept only.

    Returns:
      Its exit status and output.
    """
    process = subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if echo is not None:
                echo(line)

    reader = threading.Thread(target=read, name="tfcompress-bench-task-output", daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:
        _kill_group(process)
        raise
    if timed_out:
        _kill_group(process)
    reader.join(timeout=10)
    returncode = 124 if timed_out else process.returncode
    return WorkerRun(returncode, "".join(lines), timed_out)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def report_failure(command_name: str, label: str, run: WorkerRun) -> int:
    """Prints a failed task's output to stderr; returns the exit status to return."""
    why = "timed out" if run.timed_out else f"exit status {run.returncode}"
    print(f"{run.log}\ntfcompress bench {command_name}: {label}: {why}", file=sys.stderr)
    return run.returncode or 1
