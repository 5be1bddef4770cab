"""Reading TensorFlow's lost-worker errors, the note, the report, and the scope hook (one process).

The messages are TensorFlow 2.21's, copied from real 3-worker runs
(tests/distribute/test_lost_worker_multiworker.py makes them for real).
"""

import doctest
import sys
import types

import pytest
import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.distribute import lost_workers
from tfcompress.distribute.lost_workers import (
    LostWorker,
    explain_errors_leaving_scope,
    explain_lost_worker,
    lost_worker,
)

TASK2 = "/job:worker/replica:0/task:2"

# The note is added with BaseException.add_note (Python 3.11); 3.10 logs it.
needs_notes = pytest.mark.skipif(sys.version_info < (3, 11), reason="add_note is Python 3.11+")

CONNECTION_RESET = """Graph execution error:

Detected at node CollectiveReduceV2 defined at (most recent call last):
  File "train.py", line 149, in <module>

Collective ops is aborted by: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", grpc_status:14}
The error could be from a previous operation. Restart your program to reset.
\t [[{{node CollectiveReduceV2}}]] [Op:__inference_train_function_1324]"""  # noqa: E501

HEARTBEATS = """Graph execution error:

Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:2
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.
The error could be from a previous operation. Restart your program to reset."""  # noqa: E501

LEADER_GONE = """Graph execution error:

Collective ops is aborted by: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing network issues.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.CoordinationService/Heartbeat:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all addresses"}
The error could be from a previous operation. Restart your program to reset."""  # noqa: E501

REPORTED = """Graph execution error:

Collective ops is aborted by: Error reported from /job:worker/task:0: tfcompress: lost worker /job:worker/replica:0/task:2; seen by /job:worker/replica:0/task:0; cause: its connection broke (recvmsg:Connection reset by peer)
The error could be from a previous operation. Restart your program to reset."""  # noqa: E501


def unavailable(message: str) -> tf.errors.UnavailableError:
    return tf.errors.UnavailableError(None, None, message)


def worker(task_id: int = 0, timeout=None):
    """A stand-in for a multi-worker strategy: its task and its collective timeout."""
    ops = internal.CollectiveAllReduce(
        ["/cpu:0"], 1, tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    )
    return types.SimpleNamespace(
        cluster_resolver=types.SimpleNamespace(task_type="worker", task_id=task_id),
        extended=types.SimpleNamespace(_cross_device_ops=ops),
    )


@pytest.fixture
def reports(monkeypatch):
    """Records what would be reported to the coordination service."""
    sent = []
    monkeypatch.setattr(
        internal, "report_error_to_cluster", lambda code, message: sent.append(message) or True
    )
    monkeypatch.setattr(lost_workers, "_reported_tasks", set())
    return sent


def test_a_broken_connection_names_the_peer_that_only_this_worker_knows_lost():
    assert lost_worker(unavailable(CONNECTION_RESET)) == LostWorker(
        (TASK2,), "its connection broke (recvmsg:Connection reset by peer)", everyone_knows=False
    )


def test_missed_heartbeats_name_the_unhealthy_tasks():
    lost = lost_worker(unavailable(HEARTBEATS))
    assert lost.tasks == (TASK2,) and lost.everyone_knows
    assert lost.seen_by == "the coordination service"
    assert "stopped sending heartbeats" in lost.cause
    both = HEARTBEATS.replace(TASK2, f"/job:worker/replica:0/task:1\n{TASK2}")
    assert lost_worker(unavailable(both)).tasks == ("/job:worker/replica:0/task:1", TASK2)
    old_style = unavailable(f"Task {TASK2} heartbeat timeout. This indicates ...")
    assert lost_worker(old_style).tasks == (TASK2,)


def test_an_unreachable_coordination_service_names_its_task():
    lost = lost_worker(unavailable(LEADER_GONE))
    assert lost.tasks == ("/job:worker/replica:0/task:0",)
    assert lost.cause.startswith("the coordination service it runs is unreachable")


def test_a_report_from_another_worker_names_the_lost_worker_and_who_saw_it():
    assert lost_worker(unavailable(REPORTED)) == LostWorker(
        (TASK2,),
        "its connection broke (recvmsg:Connection reset by peer)",
        seen_by="/job:worker/replica:0/task:0",
    )


def test_docstring_examples():
    failures, tried = doctest.testmod(lost_workers)
    assert failures == 0 and tried > 0


def test_other_errors_name_no_one():
    assert lost_worker(unavailable("Socket closed")) is None
    assert lost_worker(tf.errors.InvalidArgumentError(None, None, CONNECTION_RESET)) is None
    assert lost_worker(ValueError(CONNECTION_RESET)) is None


@needs_notes
def test_the_worker_that_saw_a_connection_break_tells_the_others_once(reports):
    error = unavailable(CONNECTION_RESET)
    assert explain_lost_worker(error, worker(0)).tasks == (TASK2,)
    assert reports == [
        f"tfcompress: lost worker {TASK2}; seen by /job:worker/replica:0/task:0; "
        "cause: its connection broke (recvmsg:Connection reset by peer)"
    ]
    # What the others receive reads back as the same lost worker.
    received = unavailable(f"Error reported from /job:worker/task:0: {reports[0]}")
    assert lost_worker(received).tasks == (TASK2,)
    note = "\n".join(error.__notes__)
    assert note.startswith(f"tfcompress: lost worker {TASK2}: its connection broke")
    assert "which told the other workers" in note
    assert "heartbeat_timeout_in_ms, 10 s by default" in note
    assert "CommunicationOptions(timeout_seconds=...) bounds each collective (none set)" in note
    # The same error again (nested scopes), or another naming the same worker: no second report.
    assert explain_lost_worker(error, worker(0)) is None
    assert len(error.__notes__) == 1
    explain_lost_worker(unavailable(CONNECTION_RESET), worker(0))
    assert len(reports) == 1


@needs_notes
def test_losses_everyone_hears_of_are_not_reported_again(reports):
    for message in (HEARTBEATS, REPORTED, LEADER_GONE):
        error = unavailable(message)
        assert explain_lost_worker(error, worker(1)) is not None
        assert "tfcompress: lost worker" in error.__notes__[0]
    assert reports == []
    notes = {}
    for name, message in [("heartbeats", HEARTBEATS), ("reported", REPORTED)]:
        error = unavailable(message)
        explain_lost_worker(error, worker(1))
        notes[name] = error.__notes__[0]
    this_worker = "which told this worker (/job:worker/replica:0/task:1)"
    assert f"seen by the coordination service, {this_worker}" in notes["heartbeats"]
    assert f"seen by /job:worker/replica:0/task:0, {this_worker}" in notes["reported"]


@needs_notes
def test_a_failed_report_still_notes_the_error(monkeypatch):
    def fail(code, message):
        raise tf.errors.FailedPreconditionError(None, None, "agent in error state")

    monkeypatch.setattr(internal, "report_error_to_cluster", fail)
    monkeypatch.setattr(lost_workers, "_reported_tasks", set())
    error = unavailable(CONNECTION_RESET)
    assert explain_lost_worker(error, worker(0)) is not None
    assert "which told the other workers" not in error.__notes__[0]


@needs_notes
def test_a_collective_timeout_names_the_setting(reports):
    error = tf.errors.DeadlineExceededError(
        None, None, "Collective has timed out waiting for other workers."
    )
    assert explain_lost_worker(error, worker(0, timeout=5.0)) is None
    assert "timeout_seconds=...) bounds each collective (5 s here)" in error.__notes__[0]
    assert reports == []


@needs_notes
def test_errors_leaving_the_scope_are_explained_and_propagate_unchanged(reports):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    explain_errors_leaving_scope(strategy)
    with strategy.scope() as entered:
        assert entered is strategy and tf.distribute.get_strategy() is strategy
        variable = tf.Variable(1.0)
    assert isinstance(variable, tf.distribute.DistributedValues)
    assert not tf.distribute.has_strategy()
    error = unavailable(HEARTBEATS)
    with pytest.raises(tf.errors.UnavailableError) as raised:
        with strategy.scope():
            with strategy.scope():  # fit inside the user's scope: one note
                raise error
    assert raised.value is error and raised.value.message == HEARTBEATS
    assert len(error.__notes__) == 1 and "this process" in error.__notes__[0]
    with pytest.raises(KeyError):
        with strategy.scope():
            raise KeyError("other errors pass untouched")
    assert not tf.distribute.has_strategy()
