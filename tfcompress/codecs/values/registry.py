"""The value codecs by name and by payload id, and :func:`get_value_codec`."""

from __future__ import annotations

from tfcompress.codecs.values.base import ValueCodec
from tfcompress.codecs.values.dexpfit import DoubleExponentialFit
from tfcompress.codecs.values.order_preserving import (
    DeflateValues,
    FP16Values,
    QSGDValues,
    RawValues,
)
from tfcompress.codecs.values.polyfit import PolynomialFit

__all__ = ["VALUE_CODECS", "VALUE_CODECS_BY_ID", "get_value_codec"]


VALUE_CODECS: dict[str, type[ValueCodec]] = {
    cls.name: cls
    for cls in (
        RawValues,
        FP16Values,
        QSGDValues,
        DeflateValues,
        PolynomialFit,
        DoubleExponentialFit,
    )
}
"""Value codecs by registry name."""

VALUE_CODECS_BY_ID: dict[int, type[ValueCodec]] = {
    cls.codec_id: cls for cls in VALUE_CODECS.values()
}
"""Value codecs by the id that the DeepReduce payload header carries."""


def get_value_codec(codec: str | ValueCodec, **options) -> ValueCodec:
    """A value codec from its name and options, or the instance itself.

    Raises:
      ValueError: an unknown name (the message lists the valid ones), or
        options together with an instance.

    >>> get_value_codec("qsgd", bits=8)
    QSGDValues(bits=8, bucket_size=512, norm='max')
    """
    if isinstance(codec, ValueCodec):
        if options:
            raise ValueError(
                f"value codec options {sorted(options)} given with an instance {codec!r}"
            )
        return codec
    if not isinstance(codec, str) or codec.lower() not in VALUE_CODECS:
        raise ValueError(f"unknown value codec {codec!r}; valid names: {sorted(VALUE_CODECS)}")
    return VALUE_CODECS[codec.lower()](**options)
