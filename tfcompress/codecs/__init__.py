"""DeepReduce codecs: index codecs, value codecs and the self-describing payload container."""

from tfcompress.codecs.container import ParsedPayload, pack_payload, parse_payload
from tfcompress.codecs.index import (
    BLOOM_POLICIES,
    INDEX_CODECS,
    Bitmap,
    BloomFilter,
    DeltaVarint,
    EncodedIndices,
    IndexCodec,
    RawIndices,
    RunLength,
    bloom_false_positive_bound,
    get_index_codec,
)
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
    "BLOOM_POLICIES",
    "INDEX_CODECS",
    "VALUE_CODECS",
    "Bitmap",
    "BloomFilter",
    "DeflateValues",
    "DeltaVarint",
    "DoubleExponentialFit",
    "EncodedIndices",
    "FP16Values",
    "IndexCodec",
    "ParsedPayload",
    "PolynomialFit",
    "QSGDValues",
    "RawIndices",
    "RawValues",
    "RunLength",
    "ValueCodec",
    "bloom_false_positive_bound",
    "get_index_codec",
    "get_value_codec",
    "pack_payload",
    "parse_payload",
]
