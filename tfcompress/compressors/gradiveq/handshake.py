"""GradiVeQ's cross-worker handshake: fingerprints of ``(U, d, valid)`` and their test.

Every worker fits its basis from the same aggregates, so every worker should
hold the same ``(U, d, valid)``; coefficients projected on different bases
cannot be summed. Each payload carries two keyed hashes of those bits (as
float32, so that they ride in the all-reduce with the payload), and every
worker compares what arrives with its own: summed, the pair must be ``N``
times the local one; gathered, every worker's pair must equal it. The
package docstring (:mod:`tfcompress.compressors.gradiveq`) says what happens
when they differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

__all__ = ["agreed_in_gather", "agreed_in_sum", "fingerprint", "fingerprint_modulus"]

# Two independent keys: a collision must happen in both hashes at once.
_KEYS = ([0x5EED, 0x6A], [0xB0B, 0x1D3A])


def fingerprint_modulus(num_replicas: int) -> int:
    """The hashes' range: ``N`` fingerprints must sum exactly in float32 (below ``2^24``)."""
    return max(2, 2**24 // max(1, num_replicas))


def fingerprint(basis: tf.Tensor, d: tf.Tensor, valid: tf.Tensor, modulus: int) -> tf.Tensor:
    """Two integer-valued float32 in ``[1, modulus)``: keyed hashes of the bits of (U, d).

    ``[0, 0]`` when the layer is exact (``valid`` 0: nothing to agree on).

    Args:
      basis: ``U``, ``[l, K]``.
      d: int32 scalar, the components used.
      valid: int32 scalar, 1 when the basis is used.
      modulus: from :func:`fingerprint_modulus`.
    """
    parts = tf.strings.join(
        [
            tf.io.serialize_tensor(basis),
            tf.io.serialize_tensor(tf.stack([d, valid])),
        ]
    )
    hashes = [tf.strings.to_hash_bucket_strong(parts, modulus - 1, key=key) for key in _KEYS]
    pair = tf.cast(tf.stack(hashes) + 1, tf.float32)
    return tf.where(valid > 0, pair, tf.zeros([2], tf.float32))


def agreed_in_sum(summed: tf.Tensor, local: tf.Tensor, num_replicas: int) -> tf.Tensor:
    """Whether a summed fingerprint pair equals ``N`` times the local one (bool)."""
    return tf.reduce_all(tf.equal(summed, local * num_replicas))


def agreed_in_gather(gathered: Sequence[tf.Tensor], local: tf.Tensor) -> tf.Tensor:
    """Whether every worker's fingerprint pair equals the local one (bool)."""
    return tf.reduce_all([tf.reduce_all(tf.equal(pair, local)) for pair in gathered])
