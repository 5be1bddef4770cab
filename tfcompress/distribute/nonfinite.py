"""One rule for non-finite gradients, whatever the compressor.

Mixed precision with dynamic loss scaling expects overflow steps: the
aggregated gradients come back non-finite, the optimizer skips the step and
lowers the scale. Compressors must neither turn that into an error nor keep
anything of it in their state (an error memory or a DIANA shift that holds a
NaN poisons every later step). So, with ``CompressionPolicy(nonfinite=
"propagate")`` (the default), for every aggregation the cross-device ops:

1. compute on each worker a flag: does any float value of the aggregation
   (compressed or not) hold NaN or Inf? (:func:`local_flag`);
2. add the flag to the exact all-reduce that TensorFlow runs anyway for the
   uncompressed tensors (one scalar more; a collective of its own only when
   there are none), so every worker knows whether *any* worker saw one;
3. compress zeros in place of the compressed tensors of a worker that saw
   one (:func:`sanitize`; the step's sums are NaN anyway), so no kernel
   raises and no worker skips a collective the others run;
4. snapshot every state variable of the aggregation's compressors and
   schedule before compressing (:func:`snapshot`; TensorFlow copies a
   variable's buffer on the next in-place update only when a snapshot holds
   it, so a step that updates nothing copies nothing), and after decoding,
   if any worker flagged or a decoded sum is not finite (sums are identical
   on every worker), restore them and return NaN for every compressed
   tensor (:func:`commit_or_roll_back`).

The state after a non-finite step equals the state before it (error
memories, shifts, GradiVeQ samples and bases, PowerSGD factors, step
counters and phase schedules alike), on every worker, so the next finite
step computes what it would have computed had the bad step never happened.
``nonfinite="raise"`` instead stops at the first non-finite tensor with an
``InvalidArgumentError`` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress import _internal as internal
from tfcompress.ops.checks import check_finite

__all__ = ["commit_or_roll_back", "local_flag", "raise_if_non_finite", "sanitize", "snapshot"]

_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _values_of(value) -> tf.Tensor | None:
    """The float tensor of a dense value or of ``IndexedSlices`` (``None``: not a float)."""
    tensor = value.values if isinstance(value, tf.IndexedSlices) else value
    if not isinstance(tensor, tf.Tensor | tf.Variable) or tensor.dtype not in _FLOATS:
        return None
    return tensor


def _all_finite(tensor: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(tensor))


def local_flag(values: Sequence) -> tf.Tensor:
    """float32 scalar: 1 when a float value of ``values`` holds NaN or Inf on this worker, else 0."""
    checks = [_all_finite(t) for t in (_values_of(v) for v in values) if t is not None]
    if not checks:
        return tf.constant(0.0, tf.float32)
    return 1.0 - tf.cast(tf.reduce_all(tf.stack(checks)), tf.float32)


def sanitize(values: Sequence, local: tf.Tensor) -> list:
    """``values``, or zeros of their shapes when this worker saw a non-finite value.

    Args:
      values: the tensors (or ``IndexedSlices``) about to be compressed.
      local: this worker's :func:`local_flag` (it already checked every
        value, so nothing is read again).

    Returns:
      ``values`` as they are when ``local`` is 0, else zeros in their place
      (``IndexedSlices``: zero values, same indices). One ``tf.cond`` for the
      whole list: a step with a non-finite value ends with NaN sums and its
      state rolled back (:func:`commit_or_roll_back`), so what it compresses
      only has to be finite.
    """
    floats = [i for i, v in enumerate(values) if _values_of(v) is not None]
    if not floats:
        return list(values)
    tensors = [_values_of(values[i]) for i in floats]
    safe = tf.cond(
        local > 0,
        lambda: [tf.zeros_like(t) for t in tensors],
        lambda: [tf.identity(t) for t in tensors],
    )
    out = list(values)
    for i, tensor in zip(floats, safe, strict=True):
        value = values[i]
        tensor.set_shape(_values_of(value).shape)
        if isinstance(value, tf.IndexedSlices):
            out[i] = tf.IndexedSlices(tensor, value.indices, value.dense_shape)
        else:
            out[i] = tensor
    return out


def raise_if_non_finite(values: Sequence, keys: Sequence[str]) -> list:
    """``values``, each checked: ``InvalidArgumentError`` naming the first non-finite one."""
    checked = []
    for value, key in zip(values, keys, strict=True):
        tensor = _values_of(value)
        if tensor is None:
            checked.append(value)
            continue
        message = (
            f"tfcompress: the gradient {key} holds NaN or Inf "
            '(CompressionPolicy(nonfinite="raise")); use nonfinite="propagate" with '
            "dynamic loss scaling"
        )
        tensor = check_finite(tensor, message)
        if isinstance(value, tf.IndexedSlices):
            checked.append(tf.IndexedSlices(tensor, value.indices, value.dense_shape))
        else:
            checked.append(tensor)
    return checked


def snapshot(variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
    """The values of ``variables`` now, before the aggregation updates them.

    One read each (``value()``: no identity op after it; the graph of a
    compressor with many state variables stays small).
    """
    return [v.value() for v in variables]


def commit_or_roll_back(
    flagged: tf.Tensor,
    variables: Sequence[tf.Variable],
    before: Sequence[tf.Tensor],
    decoded: Sequence,
) -> list:
    """Keeps the step's state updates, or undoes them and returns NaN sums.

    Args:
      flagged: bool scalar, the same on every worker: a worker saw a
        non-finite value.
      variables: the state variables of the aggregation's compressors.
      before: :func:`snapshot` of ``variables`` taken before compressing.
      decoded: the decoded sums (tensors or ``IndexedSlices``).

    Returns:
      ``decoded``, or NaN-filled tensors of the same shapes when ``flagged``
      or a decoded sum is not finite (then ``variables`` are restored).
    """
    finite = [_all_finite(t) for t in (_values_of(d) for d in decoded) if t is not None]
    bad = tf.logical_or(flagged, tf.logical_not(tf.reduce_all(tf.stack(finite))))

    def roll_back():
        with tf.control_dependencies(
            [v.assign(b, read_value=False) for v, b in zip(variables, before, strict=True)]
        ):
            return tf.constant(True)

    # Rare and large (an assignment per state variable): compiled when first taken.
    restored = internal.rare_cond(bad, roll_back, lambda: tf.constant(False)) if variables else bad
    tensors = [_values_of(d) for d in decoded]
    # One cond for every sum (a cond each made the graph, and its optimisation
    # at the first step, grow with the number of tensors).
    with tf.control_dependencies([restored]):
        outs = tf.cond(
            bad,
            lambda: [tf.fill(tf.shape(t), tf.constant(float("nan"), t.dtype)) for t in tensors],
            lambda: [tf.identity(t) for t in tensors],
        )
    results = []
    for d, tensor, out in zip(decoded, tensors, outs, strict=True):
        out.set_shape(tensor.shape)
        if isinstance(d, tf.IndexedSlices):
            results.append(tf.IndexedSlices(out, d.indices, d.dense_shape))
        else:
            results.append(out)
    return results
