"""tf.function: input checks that automatic control dependencies leave unordered, rare conds,
and functions traced on purpose for each input.

Private API: ``tensorflow.python.framework.auto_control_deps`` (its resolver
hook), the ``AttrValue`` proto that marks a check, the
``_lower_using_switch_merge`` attribute of an ``If`` op (:func:`rare_cond`),
and a ``tf.function``'s ``_omit_frequent_tracing_warning`` flag
(:func:`traced_per_input`).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

# auto_control_deps: the resolver hook that takes input checks out of the
# program-order chain of stateful ops (see unordered_check).
from tensorflow.python.framework import auto_control_deps

__all__ = ["rare_cond", "traced_per_input", "unordered_check"]

# Inside a tf.function, automatic control dependencies make every stateful op
# without a resource input (an Assert) wait for the previous one, in the order
# the Python code built them. With several replicas in one process
# (MirroredStrategy over local devices) the cross-device ops build replica 0's
# whole aggregation, then replica 1's: a check on replica 0's received payload
# then comes before replica 1's checks on its own payload, which come before
# replica 1's collectives, and replica 0's collective waits for those forever.
# The order of input checks means nothing (each one guards its computation
# through an explicit control dependency), so the checks tfcompress builds are
# marked, and a resolver gives each marked op a read-only resource of its own
# (its first input): it still has to run before the function returns, but
# it is no longer ordered after, or before, any other op.

_UNORDERED_ATTR = "_tfcompress_unordered_check"
_CHECK_TYPES = frozenset({"Assert", "CheckNumerics", "CheckNumericsV2"})


def unordered_check(op: tf.Operation) -> tf.Operation:
    """Marks a check (``Assert``, ``CheckNumerics``) as free of program order; returns it.

    The op must still be made a control dependency of what it guards; in a
    tf.function it runs anyway before the function returns. Eagerly (no op)
    nothing happens.
    """
    if op is not None and not tf.executing_eagerly() and op.type in _CHECK_TYPES:
        op._set_attr(_UNORDERED_ATTR, attr_value_pb2.AttrValue(b=True))  # pylint: disable=protected-access
    return op


@auto_control_deps.register_acd_resource_resolver
def _resolve_unordered_checks(op, reads, writes) -> bool:
    """Gives a marked check its first input as a read-only 'resource' (see above)."""
    del writes
    if op.type not in _CHECK_TYPES or not op.inputs:
        return False
    try:
        marked = op.get_attr(_UNORDERED_ATTR)
    except ValueError:
        return False
    first = op.inputs[0]  # the condition of an Assert, the checked tensor of CheckNumerics
    # TF's own resolver replaces an Identity's output by its input: start from
    # there, or the two resolvers would undo each other forever.
    while first.op.type == "Identity" and first.op.inputs:
        first = first.op.inputs[0]
    if not marked or first in reads:
        return False
    reads.add(first)
    return True


# TensorFlow lowers every tf.cond of a tf.function into Switch/Merge ops of
# the one graph it optimises (Grappler) and partitions at the first call, so a
# branch that runs once in a hundred steps costs start-up time in every
# process from the first step. An If op whose "_lower_using_switch_merge"
# attribute is False stays a function call: its branch functions are
# instantiated (and optimised, once) when first taken, and a step that does
# not take them pays one small function call. Worth it for large branches that
# run rarely and hold no collective (measured: GradiVeQ's first step on 3 MLP
# tensors and 2 replicas 21.0 -> 13.6 s with every cond kept functional, but
# steady steps 0.14 -> 0.29 s, so only the rare, large ones are).
_LOWER_ATTR = "_lower_using_switch_merge"
_IF_TYPES = frozenset({"If", "StatelessIf"})


def rare_cond(pred, true_fn, false_fn):
    """``tf.cond`` whose branches are compiled when first taken, not at the first step.

    For a large branch that runs rarely and holds no collective op; results,
    ordering and state updates are those of ``tf.cond``. Eagerly it is
    ``tf.cond``.
    """
    if tf.executing_eagerly() or not tf.inside_function():
        return tf.cond(pred, true_fn, false_fn)
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    out = tf.cond(pred, true_fn, false_fn)
    for op in graph.get_operations()[first:]:
        if op.type in _IF_TYPES:
            op._set_attr(_LOWER_ATTR, attr_value_pb2.AttrValue(b=False))  # pylint: disable=protected-access
    return out


# TensorFlow warns ("N out of the last M calls to <function> triggered
# tf.function retracing") when the functions made from one Python def trace
# often. A timing harness that makes a function for each size it times (the
# planner's calibration) traces by design, once per function; the warning
# would tell its users to fix what is not wrong. The flag is the one
# TensorFlow sets on the functions of a loaded SavedModel (which it also
# traces again on purpose).
def traced_per_input(python_function):
    """``tf.function(python_function, autograph=False)`` without the frequent-retracing warning."""
    function = tf.function(python_function, autograph=False)
    function._omit_frequent_tracing_warning = True  # pylint: disable=protected-access
    return function
