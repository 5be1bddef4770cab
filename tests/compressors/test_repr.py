"""Every compressor's repr is the constructor call that makes it (``eval(repr(c))``).

The conformance class checks each compressor's ``make()``; here every
registered compressor with its defaults, and the arguments that a config
normalises or that only a wrapper takes (QSGD's ``bits``, codec instances,
Switch's phases, fixed ``k``).
"""

from __future__ import annotations

import pytest

from tests.compressors.conformance import REPR_NAMESPACE, check_repr_evaluates_back
from tfcompress.compressors import registry

#: The options a compressor has no default for (the registry needs them).
REQUIRED = {
    "threshold": {"value": 1e-3},
    "error_feedback": {"inner": "topk"},
    "diana": {"inner": "qsgd"},
    "switch": {"phases": [None, "qsgd"]},
}

#: Constructor calls as users write them.
CALLS = [
    "QSGD(bits=4)",
    "QSGD(levels=15)",
    "QSGD(bits=1, norm='max', seed=7)",
    "QSGD(levels=10, bucket_size=64)",
    "QSGD(levels=255)",
    "TernGrad(clip=2.5, seed=1)",
    "SignSGD(scale=None, aggregate='majority')",
    "PQuant(p='inf', block_size=64, seed=3)",
    "FP16(dtype='bfloat16', predivide='workers')",
    "FP16(predivide=4)",
    "TopK(k=5)",
    "RandomK(k=5, seed=2)",
    "RandomK(ratio=0.1)",
    "Threshold(0.5)",
    "ErrorFeedback(TopK(k=3))",
    "ErrorFeedback('signsgd')",
    "DIANA(RandomK(ratio=0.1), alpha=0.5, momentum=0.9)",
    "DIANA(QSGD(bits=2))",
    "DeepReduce(RandomK(k=8), index_codec='varint', value_codec='fp16')",
    "DeepReduce(fpr=1e-3, policy='conflict_sets')",
    "DeepReduce(value_codec='qsgd', value_options={'bits': 8}, seed=4)",
    "DeepReduce(Threshold(0.1), index_codec=BloomFilter(policy='random'),"
    " value_codec=DeflateValues(shuffle=False))",
    "GradiVeQ(sampling=QSGD(bits=2), components=4, refit_steps=None)",
    "GradiVeQ(sample_steps=10, energy=0.9, slice_size=64)",
    "GradiVeQ.paper()",
    "PowerSGD(rank=4, start_step=0, warm_start=False)",
    "Switch([None, QSGD(bits=2), ErrorFeedback(TopK(k=2))], initial_phase=1)",
    "Switch(['identity', 'fp16'])",
]


@pytest.mark.parametrize("name", registry.available())
def test_every_registered_compressor_with_its_defaults(name):
    check_repr_evaluates_back(registry.get(name, **REQUIRED.get(name, {})))


@pytest.mark.parametrize("call", CALLS)
def test_constructor_calls(call):
    check_repr_evaluates_back(eval(call, dict(REPR_NAMESPACE)))


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("QSGD(bits=4)", "QSGD(bits=4, bucket_size=512, norm='l2', seed=None)"),
        # One compressor, one spelling: bits wherever the levels are 2**bits - 1.
        ("QSGD()", "QSGD(bits=4, bucket_size=512, norm='l2', seed=None)"),
        ("QSGD(levels=15)", "QSGD(bits=4, bucket_size=512, norm='l2', seed=None)"),
        ("QSGD(levels=10)", "QSGD(levels=10, bucket_size=512, norm='l2', seed=None)"),
        # The sparsifiers that keep a share or a fixed count read alike.
        ("TopK()", "TopK(ratio=0.01, k=None)"),
        ("RandomK()", "RandomK(ratio=0.01, k=None, seed=0)"),
        ("RandomK(k=5)", "RandomK(ratio=None, k=5, seed=0)"),
        ("ErrorFeedback(TopK())", "ErrorFeedback(TopK(ratio=0.01, k=None))"),
        (
            "Switch([None, 'qsgd'])",
            "Switch(phases=[Identity(), QSGD(bits=4, bucket_size=512, norm='l2', seed=None)], "
            "initial_phase=0)",
        ),
        (
            "DeepReduce(fpr=1e-3)",
            "DeepReduce(sparsifier=TopK(ratio=0.01, k=None, warmup_steps=100), "
            "index_codec='auto', value_codec='qsgd', seed=0, "
            "index_options={'false_positive_rate': 0.001}, value_options=None)",
        ),
    ],
)
def test_repr_text(call, expected):
    assert repr(eval(call, dict(REPR_NAMESPACE))) == expected
