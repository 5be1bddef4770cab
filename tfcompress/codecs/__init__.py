"""DeepReduce codecs: value codecs and the self-describing payload container."""

from tfcompress.codecs.container import ParsedPayload, pack_payload, parse_payload
from tfcompress.codecs.values import (
    VALUE_CODECS,
    DeflateValues,
    DoubleExponentialFit,
    FP16Values,
    PolynomialFit,
    QSGDValues,
    RawValues,
    ValueCodec,
    get_value_codec,
)

__all__ = [
    "VALUE_CODECS",
    "DeflateValues",
    "DoubleExponentialFit",
    "FP16Values",
    "ParsedPayload",
    "PolynomialFit",
    "QSGDValues",
    "RawValues",
    "ValueCodec",
    "get_value_codec",
    "pack_payload",
    "parse_payload",
]
