"""Errors that mean a worker was lost: which one, and the other workers told at once.

What TensorFlow 2.21 does when one worker of a ``MultiWorkerMirroredStrategy``
cluster is lost (measured with 3 CPU workers on loopback; "When a worker is lost"
in docs/howto/run-on-machines.md has the times):

* It crashes (process gone, sockets closed): the worker that receives from it
  in the ring all-reduce gets ``UnavailableError`` at once ("recvmsg:Connection
  reset by peer ... from remote target /job:worker/replica:0/task:2 while
  calling /tensorflow.WorkerService/RecvBuf"). TensorFlow tells no one else:
  the others wait in their collective until the coordination service misses
  the lost worker's heartbeats, or until the service's host (task 0) exits,
  and then they blame task 0.
* It hangs (alive, sockets open, never answering): nothing breaks; after the
  heartbeat timeout (``heartbeat_timeout_in_ms`` of TensorFlow's
  ``CoordinationServiceConfig``, 10 s by default) the coordination service
  aborts every worker's collectives with "The following tasks are unhealthy
  (stopped sending heartbeats): /job:worker/replica:0/task:2".
* With ``CommunicationOptions(timeout_seconds=...)``, a collective that takes
  longer raises ``DeadlineExceededError``, which names no worker.

:func:`explain_lost_worker` reads such an error and adds a note that names the
lost worker and the settings that govern detection; when this worker alone
knows (a broken connection), it also reports the loss through the coordination
service, so that every other worker stops within a second, naming the same
worker. tfcompress's ``MultiWorkerMirroredStrategy`` calls it for every error
that leaves ``strategy.scope()`` (:func:`explain_errors_leaving_scope`):
tf-keras' ``model.fit`` runs inside the scope; Keras 3's does not, so Keras 3
users (and custom loops run outside the scope) call
:func:`explain_lost_worker` where they catch the error. The error itself
propagates unchanged but for the note: TensorFlow cannot go on after losing a
worker, every worker must be restarted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading

import tensorflow as tf

from tfcompress import _internal as internal

__all__ = [
    "PEER_ERRORS",
    "LostWorker",
    "explain_errors_leaving_scope",
    "explain_lost_worker",
    "lost_worker",
]

_log = logging.getLogger(__name__)

#: The error types through which TensorFlow reports a lost peer.
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)

# Seconds to wait for the report to the coordination service. It is one RPC to
# task 0; should task 0 be unreachable too, the error must still propagate.
_REPORT_TIMEOUT = 5.0

_TASK = r"/job:[\w-]+(?:/replica:\d+)?/task:\d+"
_REPORT_PREFIX = "tfcompress: lost worker"
# What explain_lost_worker reports; the coordination service hands it to the
# other workers as "Error reported from <task>: <this>".
_REPORTED = re.compile(rf"{_REPORT_PREFIX} ({_TASK}); seen by ({_TASK}); cause: ([^\n\[]*)")
_HEARTBEATS = re.compile(rf"stopped sending heartbeats\):\s*((?:{_TASK}\s*)+)")
_HEARTBEAT_TIMEOUT = re.compile(rf"({_TASK}) heartbeat timeout")
_REMOTE = re.compile(
    rf"([^\n]*)\nAdditional GRPC error information from remote target ({_TASK}) "
    r"while calling /tensorflow\.(\w+)/"
)
_COLLECTIVE_TIMEOUT = "Collective has timed out"
_SERVICE = "the coordination service"
_NO_HEARTBEATS = (
    "it stopped sending heartbeats to the coordination service "
    "(it hangs, crashed, or cannot be reached)"
)
_ABORTED_BY = "Collective ops is aborted by: "
_NOTED = "_tfcompress_lost_worker_noted"

_reported_tasks: set[str] = set()


@dataclasses.dataclass(frozen=True)
class LostWorker:
    """A worker that a TensorFlow error says is gone.

    Attributes:
      tasks: the lost workers' task names, e.g. ``("/job:worker/replica:0/task:2",)``.
      cause: what happened to them, in words.
      seen_by: who saw it, when not this worker: the coordination service
        (missed heartbeats), or the task name of the worker that reported it.
      everyone_knows: whether TensorFlow's coordination service tells (or told)
        every worker; False when only this worker knows (a broken connection).
    """

    tasks: tuple[str, ...]
    cause: str
    seen_by: str | None = None
    everyone_knows: bool = True


def lost_worker(error: BaseException) -> LostWorker | None:
    """The worker that ``error`` says was lost, read from TensorFlow's message.

    Args:
      error: any exception; only :data:`PEER_ERRORS` can name a lost worker.

    Returns:
      The lost worker, or ``None`` when the error names none (a collective
      timeout names none either).

    >>> error = tf.errors.UnavailableError(None, None, (
    ...     "The following tasks are unhealthy (stopped sending heartbeats):\\n"
    ...     "/job:worker/replica:0/task:2\\nThe tasks have crashed."))
    >>> lost_worker(error).tasks
    ('/job:worker/replica:0/task:2',)
    """
    if not isinstance(error, PEER_ERRORS):
        return None
    message = error.message
    if match := _REPORTED.search(message):
        return LostWorker((match[1],), match[3].strip(), seen_by=match[2])
    if match := _HEARTBEATS.search(message):
        return LostWorker(tuple(re.findall(_TASK, match[1])), _NO_HEARTBEATS, seen_by=_SERVICE)
    if match := _HEARTBEAT_TIMEOUT.search(message):
        return LostWorker((match[1],), _NO_HEARTBEATS, seen_by=_SERVICE)
    if match := _REMOTE.search(message):
        detail = match[1].strip().removeprefix(_ABORTED_BY)
        if match[3] == "CoordinationService":
            return LostWorker(
                (match[2],), f"the coordination service it runs is unreachable ({detail})"
            )
        return LostWorker((match[2],), f"its connection broke ({detail})", everyone_knows=False)
    return None


def explain_lost_worker(
    error: BaseException, strategy: tf.distribute.Strategy
) -> LostWorker | None:
    """Notes on ``error`` which worker was lost; tells the others if only this one knows.

    The note (``error.add_note``; logged on Python 3.10) names the lost worker,
    the cause, and the settings that govern how soon a loss is seen. A broken
    connection is reported through TensorFlow's coordination service, which
    aborts the other workers' collectives with the same name (once per lost
    worker and process). Call it where the error is caught, then re-raise: the
    cluster cannot go on. A second call with the same error does nothing.

    Args:
      error: the exception that stopped training.
      strategy: the ``MultiWorkerMirroredStrategy`` it was training under.

    Returns:
      The lost worker, or ``None`` when ``error`` names none (or was explained before).
    """
    if not isinstance(error, PEER_ERRORS) or getattr(error, _NOTED, False):
        return None
    lost = lost_worker(error)
    timeout = _collective_timeout(strategy)
    if lost is None:
        if isinstance(error, tf.errors.DeadlineExceededError) and _COLLECTIVE_TIMEOUT in (
            error.message
        ):
            _add_note(error, _timeout_note(timeout))
        return None
    this_task = _task_name(strategy)
    reported = False
    if (
        not lost.everyone_knows
        and this_task.startswith("/job:")
        and lost.tasks[0] not in _reported_tasks
    ):
        _reported_tasks.add(lost.tasks[0])
        reported = _tell_the_others(
            error.error_code,
            f"{_REPORT_PREFIX} {lost.tasks[0]}; seen by {this_task}; cause: {lost.cause}",
        )
    _add_note(error, _lost_note(lost, this_task, reported, timeout))
    return lost


def explain_errors_leaving_scope(strategy: tf.distribute.Strategy) -> None:
    """Makes ``strategy.scope()`` call :func:`explain_lost_worker` on the errors leaving it.

    The strategy object keeps its class; only its ``scope`` method is wrapped
    (the context manager it returns is TensorFlow's, entered and exited as
    before).

    Args:
      strategy: a multi-worker strategy.
    """
    scope = strategy.scope

    @contextlib.contextmanager
    def explaining_scope():
        with scope() as entered:
            try:
                yield entered
            except PEER_ERRORS as error:
                explain_lost_worker(error, strategy)
                raise

    explaining_scope.__doc__ = scope.__doc__
    strategy.scope = explaining_scope


def _tell_the_others(code: int, message: str) -> bool:
    """Reports ``message`` to every worker; False if that failed or took too long."""
    outcome: list[bool] = []

    def report() -> None:
        try:
            outcome.append(internal.report_error_to_cluster(code, message))
        except (tf.errors.OpError, ValueError) as failure:
            _log.warning("tfcompress: could not tell the other workers: %s", failure)

    thread = threading.Thread(target=report, name="tfcompress-report-lost-worker", daemon=True)
    thread.start()
    thread.join(_REPORT_TIMEOUT)
    return bool(outcome and outcome[0])


def _lost_note(lost: LostWorker, this_task: str, reported: bool, timeout: float | None) -> str:
    names = ", ".join(lost.tasks)
    if lost.seen_by is not None:
        seen = f"seen by {lost.seen_by}, which told this worker ({this_task})"
    else:
        seen = f"seen by this worker ({this_task})"
        if reported:
            seen += ", which told the other workers"
    return (
        f"{_REPORT_PREFIX} {names}: {lost.cause}; {seen}.\n"
        "tfcompress: TensorFlow cannot go on without it: restart every worker (BackupAndRestore "
        "or a checkpoint resumes). A crash is seen at once where connections break; a hung "
        "worker after the coordination service's heartbeat timeout (heartbeat_timeout_in_ms, "
        "10 s by default); " + _timeout_setting(timeout)
    )


def _timeout_note(timeout: float | None) -> str:
    return (
        "tfcompress: a collective timed out: a worker may be lost or slow, and TensorFlow "
        "does not say which; the coordination service names a lost worker after its heartbeat "
        "timeout (heartbeat_timeout_in_ms, 10 s by default); " + _timeout_setting(timeout)
    )


def _timeout_setting(timeout: float | None) -> str:
    limit = "none set" if not timeout else f"{timeout:g} s here"
    return f"CommunicationOptions(timeout_seconds=...) bounds each collective ({limit})."


def _add_note(error: BaseException, note: str) -> None:
    setattr(error, _NOTED, True)
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10
        _log.error("%s", note)


def _task_name(strategy: tf.distribute.Strategy) -> str:
    resolver = strategy.cluster_resolver
    if resolver is None or resolver.task_type is None:
        return "this process"
    return f"/job:{resolver.task_type}/replica:0/task:{resolver.task_id}"


def _collective_timeout(strategy: tf.distribute.Strategy) -> float | None:
    ops = internal.cross_device_ops_or_none(strategy)
    if not isinstance(ops, internal.CollectiveAllReduce):
        return None
    return internal.options_of(ops).timeout_seconds
