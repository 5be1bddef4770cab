"""DeepReduce value codecs: the values of a sparse tensor, as bytes.

DeepReduce (Xu, Kostopoulou, Dutta, Li, Ntoulas and Kalnis, "DeepReduce: A
Sparse-tensor Communication Framework for Federated Deep Learning",
NeurIPS 2021) sends a sparse tensor as two independently compressed parts:
the positions (:mod:`tfcompress.codecs.index`) and the values (this module).
Every value codec maps ``r`` values of the gradient's dtype ``T`` (float16,
bfloat16, float32 or float64), ordered by ascending position (the order in
which the index codecs decode positions), to one uint8 vector, and back:

``encode(values: T [r], seed: int64 [2] | None) -> uint8 [n]``
``decode(data: uint8 [n], count: int64 scalar, dtype: T = float32) -> T [count]``

The bytes do not name ``T``: the decoder must be given the encoder's dtype.
DeepReduce takes it from the dtype code of its payload header
(:mod:`tfcompress.codecs.container`), which the receiver checks against the
gradient's dtype before it reads the value section.

======== == ======== ========= =========================================================
name     id lossless order     bytes for ``r`` values of ``T`` (``b = ceil(log2 r)``)
======== == ======== ========= =========================================================
raw      1  yes      kept      ``r itemsize(T)``: ``T``'s own bytes (2, 2, 4 or 8 per value)
fp16     2  no       kept      ``2 r``: float16 (bfloat16's own bits for bfloat16)
qsgd     3  no       kept      ``4 ceil(r / B) + ceil(r (bits + 1) / 8)`` (QSGD, buckets B)
deflate  4  yes      kept      zlib stream of ``T``'s bytes, shuffled into byte planes
polyfit  5  no       permuted  ``4 + 4 S (degree + 2) + ceil(r b / 8)``, S <= max_segments
dexpfit  6  no       permuted  ``16 + ceil(r / 8) + ceil(r b / 8)``
======== == ======== ========= =========================================================

The lossless codecs keep every ``T`` bit for bit (float64 included); the
lossy ones compute in float32 or float64 and decode to ``T`` (each class's
docstring says how).

Non-finite values, one rule for every codec (``ValueCodec.lossless``):

* the lossless codecs (``raw``, ``deflate``) carry NaN and +-Inf bit for bit,
  NaN payloads included, as TensorFlow's own all-reduce would;
* every lossy codec (``fp16``, ``qsgd``, ``polyfit``, ``dexpfit``) rejects
  them at encoding with ``tf.errors.InvalidArgumentError`` naming the tensor
  (its graph name, or ``values`` eagerly) and the first position holding one:
  there is no finite float16 for Inf, no float32 norm or fitted coefficient
  that represents a NaN, and a silent substitute (fp16 used to saturate Inf
  to 65504) would hide a diverging step. Their decoders, in turn, treat a
  non-finite value on the wire as a corrupted payload.

Through the strategies none of this is reached: the cross-device ops compress
zeros in place of a non-finite gradient and return NaN sums for the step
(:mod:`tfcompress.distribute.nonfinite`), and the sparsifiers DeepReduce
selects with raise on NaN and Inf before any value codec runs.

The curve fits are not order preserving: they fit the *sorted* values, so
they also send the permutation that sorts them, ``perm[j]`` = the position
(in ``[0, r)``) of the ``j``-th sorted value, bit-packed at ``b = ceil(log2
r)`` bits per entry (0 bits for ``r <= 1``) in the :mod:`tfcompress.ops.bitpack`
layout. Byte order of every multi-byte number is little-endian (the byte
order of the hosts TensorFlow runs on; ``tf.bitcast`` writes host order).

Decoders validate everything they read (lengths, padding bits, segment
tables, that the permutation is one, finite coefficients) and raise
``tf.errors.InvalidArgumentError`` ("corrupted payload") otherwise.

Modules (each imports only those above it): ``base`` (:class:`ValueCodec`,
the supported dtypes, the byte helpers), ``order_preserving`` (``raw``,
``fp16``, ``qsgd``, ``deflate``), ``fitting`` (what the curve fits share: the
permutation on the wire, the coefficient checks), ``polyfit``, ``dexpfit``,
``registry`` (the codecs by name and id, :func:`get_value_codec`). This
package only re-exports.
"""

from tfcompress.codecs.values.base import SUPPORTED_DTYPES, ValueCodec
from tfcompress.codecs.values.dexpfit import DoubleExponentialFit
from tfcompress.codecs.values.fitting import permutation_bits
from tfcompress.codecs.values.order_preserving import (
    DeflateValues,
    FP16Values,
    QSGDValues,
    RawValues,
)
from tfcompress.codecs.values.polyfit import POLYFIT_MAX_VALUES, PolynomialFit
from tfcompress.codecs.values.registry import VALUE_CODECS, VALUE_CODECS_BY_ID, get_value_codec

__all__ = [
    "POLYFIT_MAX_VALUES",
    "SUPPORTED_DTYPES",
    "VALUE_CODECS",
    "VALUE_CODECS_BY_ID",
    "DeflateValues",
    "DoubleExponentialFit",
    "FP16Values",
    "PolynomialFit",
    "QSGDValues",
    "RawValues",
    "ValueCodec",
    "get_value_codec",
    "permutation_bits",
]
