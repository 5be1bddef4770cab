"""GradiVeQ's phase branches: the compressors a bound tensor switches between.

Branch 0 (warm-up and sampling) is :class:`ExactBranch` or
:class:`SamplingBranch`, branch 1 (compressed) :class:`CompressedBranch`;
each is a view of one tensor's :class:`~tfcompress.compressors.gradiveq.layer.GradiVeQLayer`,
which holds the state and makes them (``GradiVeQLayer.branch``). They take
the layer as an argument and do not import its module, which imports this
one (tests/test_layers.py forbids import cycles); hence ``layer`` is typed as
a :class:`Compressor`.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfcompress.compressors.base import Compressor, Payload
from tfcompress.compressors.gradiveq import handshake
from tfcompress.ops.checks import invalid_argument, require

__all__ = [
    "SKETCH",
    "CompressedBranch",
    "ExactBranch",
    "SamplingBranch",
    "StagedSampling",
    "checked_tensors",
    "decode",
    "encode",
]

SKETCH = "residual_sketch"
"""The compressed payload's sketch of the dropped residual (``GradiVeQLayer.residual_sketch``)."""


class _Branch(Compressor):
    """One branch of a GradiVeQ tensor's switch: a compressor bound to the tensor's layer."""

    name = "gradiveq"

    def __init__(self, layer: Compressor):
        self.layer = layer
        self.supported_dtypes = layer.supported_dtypes


class ExactBranch(_Branch):
    """Branch 0 with exact sampling: the gradient itself (plus the residual) and the check."""

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        values = layer.with_residual(x)
        with tf.control_dependencies(layer.set_residual(None)):
            check = tf.identity(layer.local_check())
        return Payload(tensors={"values": values, "check": check}, **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        agreed = layer.agreed_in_sum(payload.tensors["check"])
        return layer.record(payload.tensors["values"], agreed)


class SamplingBranch(_Branch):
    """Branch 0 with a sampling compressor: its payload plus the check; records the aggregate."""

    @property
    def summable(self) -> bool:  # type: ignore[override]
        return self.layer.sampler.summable

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        x = self._check_input(x)
        payload = layer.sampler.compress(layer.with_residual(x))
        with tf.control_dependencies(layer.set_residual(None)):
            check = tf.identity(layer.local_check())
        return payload.replace({**payload.tensors, _CHECK: check})

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        decoded = layer.sampler.decompress(_without_check(payload))
        if not self.summable:
            return decoded
        return layer.record(decoded, layer.agreed_in_sum(payload.tensors[_CHECK]))

    def aggregate(self, payloads: Sequence[Payload]) -> tf.Tensor:
        layer = self.layer
        agreed = handshake.agreed_in_gather(
            [p.tensors[_CHECK] for p in payloads], layer.local_check()
        )
        total = layer.sampler.aggregate([_without_check(p) for p in payloads])
        return layer.record(total, agreed)

    def staged(self, num_shards: int) -> StagedSampling:
        """This branch on the two-stage path (see :attr:`GradiVeQ.staged_phase`)."""
        return StagedSampling(self.layer, num_shards)


class StagedSampling:
    """Branch 0 with the sampling compressor, sent in two stages over ``num_shards`` owners.

    The strategy's two-stage path (``distribute.pipeline.two_stage_pack``)
    calls :meth:`prepare` on the gradient, deals it into shards and
    compresses shard ``j`` with ``shards[j]``; the owner of a shard sums the
    workers' payloads with its ``aggregate`` and compresses the sum with
    :attr:`second`, whose payload also carries the owner's fingerprint pair
    (the handshake's check); every worker decodes the owners' payloads and
    hands their interleaved sum to :meth:`complete`, which records it for
    the fit. All of them hold the same bits, so they fit the same basis.

    One bound sampler serves every shard and the second stage: its step
    counter advances ``N + 1`` times per sampling step, the same on every
    worker, so each call draws fresh noise and nothing new is checkpointed.
    """

    def __init__(self, layer: Compressor, num_shards: int):
        self.layer = layer
        sampler = layer.sampler
        self.shards = (sampler,) * num_shards
        self.second = _OwnerSampling(layer)

    def prepare(self, x: tf.Tensor) -> tf.Tensor:
        """The gradient to shard: ``x`` plus the residual (error feedback), which is cleared."""
        layer = self.layer
        x = self.second._check_input(x)  # the dtype check every branch makes
        values = layer.with_residual(x)
        with tf.control_dependencies(layer.set_residual(None)):
            return tf.identity(values)

    def complete(self, total: tf.Tensor, gathered: Sequence[Payload]) -> tf.Tensor:
        """Records ``total`` (the decoded sum) after checking the owners' fingerprints."""
        layer = self.layer
        agreed = handshake.agreed_in_gather(
            [p.tensors[_CHECK] for p in gathered], layer.local_check()
        )
        return layer.record(total, agreed)


class _OwnerSampling(_Branch):
    """A shard owner's second stage: the sampled sum plus the owner's fingerprint pair."""

    def compress(self, x: tf.Tensor) -> Payload:
        layer = self.layer
        payload = layer.sampler.compress(x)
        return payload.replace({**payload.tensors, _CHECK: layer.local_check()})

    def decompress(self, payload: Payload) -> tf.Tensor:
        return self.layer.sampler.decompress(_without_check(payload))


_CHECK = "gradiveq_check"


def _without_check(payload: Payload) -> Payload:
    return payload.replace({k: v for k, v in payload.tensors.items() if k != _CHECK})


class CompressedBranch(_Branch):
    """Branch 1: ``U_d g_n`` per pack of slices, summed by all-reduce.

    An exact layer (degenerate samples, a failed self-check, or workers that
    did not agree) has ``d = 0``, and its pack tensors append the ``K`` raw
    rows, so one payload layout serves both cases. The work over ``K`` is two
    matrix products with ``U_d`` (a view of the basis's first ``d`` rows, not
    a copy) and one reduction of the gradient (its norm, for the error).
    """

    summable = True

    def compress(self, x: tf.Tensor) -> Payload:
        x = self._check_input(x)
        return Payload(tensors=self.layer.encode(x), **self._metadata(x))

    def decompress(self, payload: Payload) -> tf.Tensor:
        layer = self.layer
        d = layer.components.read_value()
        check, packs, sketch = checked_tensors(layer, payload, d)
        differs = (
            f"GradiVeQ: the basis (U, d) of tensor {layer.context.key} differs "
            "across workers (sum of fingerprints != N x local fingerprint) although "
            "they agreed at the end of sampling: the state was changed on one worker "
            "(e.g. restored from another checkpoint); their coefficients cannot be "
            "summed"
        )
        same = require(layer.agreed_in_sum(check[:2]), lambda: [differs])
        summed = tf.concat(packs, axis=1) if len(packs) > 1 else packs[0]  # [d (+K), S]
        slices = layer.decode(check, summed, sketch)
        with tf.control_dependencies(same):
            return tf.identity(layer.unslice(slices, payload))


def encode(layer: Compressor, x: tf.Tensor) -> dict[str, tf.Tensor]:
    """A compressed step's payload tensors for a checked gradient ``x``.

    Per pack ``p`` of slices, ``coefficients_p`` ``[d (+K), S_p]`` (see
    :class:`CompressedBranch`), the residual sketch and ``check`` (the
    fingerprint pair and the local relative error); updates the residual
    with error feedback.
    """
    slices = layer.slices(layer.with_residual(x))
    k = layer.geometry[0]
    cdt = layer.compute_dtype
    d = layer.components.read_value()
    exact = 1 - layer.valid.read_value()
    basis = layer.basis.read_value()[:d]  # a view: rows of a row-major variable
    tensors = {}
    captured = tf.constant(0.0, cdt)
    residuals = []
    all_coefficients = []
    for p, (a, b) in enumerate(layer.pack_bounds):
        part = slices[a:b]
        coefficients = tf.matmul(basis, part, transpose_b=True)
        all_coefficients.append(coefficients)
        # [K, S_p] for an exact layer, else [0, S_p] (no transposed copy of the slices)
        raw = tf.transpose(part[:, : k * exact])
        tensors[f"coefficients_{p}"] = tf.concat([coefficients, raw], axis=0)
        captured += tf.reduce_sum(tf.square(coefficients))
        if layer.residual is not None:
            kept = tf.matmul(coefficients, basis, transpose_a=True)
            residuals.append((part - kept) * tf.cast(1 - exact, part.dtype))
    coefficients = (
        tf.concat(all_coefficients, axis=1) if len(all_coefficients) > 1 else all_coefficients[0]
    )
    sketch = layer.residual_sketch(slices, coefficients, basis)
    tensors[SKETCH] = sketch * tf.cast(1 - exact, cdt)  # an exact layer drops nothing
    flat = tf.reshape(slices, [1, -1])
    norm = tf.squeeze(tf.matmul(flat, flat, transpose_b=True))
    # ||g - U^T c||^2 = ||g||^2 - ||c||^2 for orthonormal rows of U.
    relative = tf.sqrt(tf.math.divide_no_nan(tf.maximum(norm - captured, 0.0), norm))
    relative = tf.cast(relative, tf.float32) * tf.cast(1 - exact, tf.float32)
    dependencies = []
    if residuals:
        dependencies = layer.set_residual(tf.concat(residuals, axis=0))
    with tf.control_dependencies(dependencies):
        tensors["check"] = tf.concat([layer.local_check(), relative[None]], axis=0)
    return tensors


def decode(layer: Compressor, check: tf.Tensor, summed: tf.Tensor, sketch: tf.Tensor) -> tf.Tensor:
    """The slices ``[S, K]`` of checked, summed coefficients; records the step's errors.

    ``summed``: the packs side by side, ``[d (+K), S]``; the result runs
    after the errors are stored (``GradiVeQLayer.record_error``).
    """
    d = layer.components.read_value()
    replicas = layer.context.num_replicas

    def projected() -> tf.Tensor:  # U_d^T c, [S, K], written once
        basis = layer.basis.read_value()[:d]
        return tf.matmul(summed[:d], basis, transpose_a=True)

    def raw() -> tf.Tensor:  # an exact layer: d = 0, the raw rows follow
        return tf.transpose(summed[d:])

    slices = tf.cond(layer.valid.read_value() > 0, projected, raw)
    mean_error = check[2] / replicas
    # ||g||^2 = ||U_d^T g||^2 + ||residual||^2; the sketch estimates the second.
    dropped = tf.reduce_sum(tf.square(sketch))
    kept = tf.reduce_sum(tf.square(summed[:d]))
    sum_error = tf.sqrt(tf.math.divide_no_nan(dropped, dropped + kept))
    sum_error = tf.cast(sum_error, tf.float32)
    recorded = layer.record_error(mean_error, sum_error)
    with tf.control_dependencies(recorded):
        return tf.identity(slices)


def checked_tensors(
    layer: Compressor, payload: Payload, d: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor]:
    """``check``, the coefficient packs and the residual sketch of a compressed payload, checked.

    Pack ``p`` must be ``[d + K (1 - valid), S_p]``, ``check`` ``[3]`` and
    the sketch ``[a, b]`` (``GradiVeQLayer.sketch_shape``): a
    pack with a row too many or a column too few would otherwise decode to a
    wrong gradient without an error (docs/PAYLOADS.md: every decoder checks
    every length).

    Raises:
        tf.errors.InvalidArgumentError: a tensor is missing or of the wrong
            rank (at trace time), or of the wrong shape (at run time), naming
            the tensor.
    """
    key = layer.context.key
    k = layer.geometry[0]
    rows = d + tf.constant(k, d.dtype) * (1 - layer.valid.read_value())
    sketch_rows, sketch_columns = layer.sketch_shape
    expected = [("check", None, 3), (SKETCH, sketch_rows, sketch_columns)] + [
        (f"coefficients_{p}", rows, b - a) for p, (a, b) in enumerate(layer.pack_bounds)
    ]
    checked = {}
    static_rows = {}  # the first pack's static row count, which every pack must share
    for name, expected_rows, columns in expected:
        if name not in payload.tensors:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: tensor {key} has no `{name}` "
                f"(got {sorted(payload.tensors)})"
            )
        tensor = tf.convert_to_tensor(payload.tensors[name])
        rank = 1 if expected_rows is None else 2
        if tensor.shape.rank is not None and tensor.shape.rank != rank:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                f"{tensor.shape}, expected rank {rank}"
            )
        static = tensor.shape.as_list() if tensor.shape.rank is not None else None
        if static is not None and static[-1] is not None and static[-1] != columns:
            raise invalid_argument(
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                f"{tensor.shape}, expected {columns} columns"
            )
        packed = name.startswith("coefficients_")
        if packed and static is not None and static[0] is not None:
            first = static_rows.setdefault("rows", (name, static[0]))
            if first[1] != static[0]:
                raise invalid_argument(
                    f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape "
                    f"{tensor.shape}: {static[0]} rows, but `{first[0]}` has {first[1]}"
                )
        shape = tf.shape(tensor, out_type=tf.int64)
        if expected_rows is None:
            want = tf.constant([columns], tf.int64)
            text = f"[{columns}]"
        else:
            want = tf.stack([tf.cast(expected_rows, tf.int64), tf.constant(columns, tf.int64)])
            text = (
                f"[d + K (1 - valid), {columns}] (K = {k})"
                if packed
                else f"[{expected_rows}, {columns}]"
            )
        checks = require(
            tf.equal(tf.size(shape), rank) & tf.reduce_all(tf.equal(shape, want)),
            lambda name=name, shape=shape, want=want, text=text: [
                f"GradiVeQ: corrupted payload: `{name}` of tensor {key} has shape ",
                shape,
                f", expected {text} = ",
                want,
            ],
        )
        with tf.control_dependencies(checks):
            checked[name] = tf.identity(tensor)
    packs = [checked[f"coefficients_{p}"] for p in range(len(layer.pack_bounds))]
    return checked["check"], packs, checked[SKETCH]
