"""The cross-worker settings check, in one process: what it compares and what it says.

The real 2-worker runs are in test_worker_failures.py; here the items of
every compressor option, the message, and the check's two gathers (with a
fake gather that plays a second worker).
"""

import doctest
import inspect

import numpy as np
import pytest
import tensorflow as tf

import tfcompress
from tests.distribute.test_mirrored import make
from tfcompress.codecs import BloomFilter, DeflateValues
from tfcompress.compressors import QSGD, RandomK, TopK, get, registry
from tfcompress.distribute import Aggregation, CompressionPolicy
from tfcompress.distribute import settings as settings_module
from tfcompress.distribute.settings import (
    MISMATCH_PREFIX,
    check_same_settings,
    describe_difference,
    parse_items,
    settings_items,
    settings_items_text,
)

POLICY = CompressionPolicy()

# (registry name, options of both, option that differs, its other value, the option named)
CHANGES = [
    ("fp16", {}, "dtype", "bfloat16", "compressor.dtype"),
    ("fp16", {}, "predivide", "workers", "compressor.predivide"),
    ("qsgd", {}, "bits", 2, "compressor.levels"),
    ("qsgd", {}, "levels", 16, "compressor.levels"),
    ("qsgd", {}, "bucket_size", 256, "compressor.bucket_size"),
    ("qsgd", {}, "norm", "max", "compressor.norm"),
    ("qsgd", {}, "seed", 1, "compressor.seed"),
    ("terngrad", {}, "clip", 2.5, "compressor.clip"),
    ("terngrad", {}, "seed", 1, "compressor.seed"),
    ("signsgd", {}, "scale", None, "compressor.scale"),
    ("signsgd", {}, "aggregate", "majority", "compressor.aggregate"),
    ("topk", {}, "ratio", 0.1, "compressor.ratio"),
    ("topk", {}, "k", 5, "compressor.ratio"),
    ("topk", {}, "warmup_steps", 100, "compressor.warmup_steps"),
    ("topk", {}, "warmup_density", 0.5, "compressor.warmup_density"),
    ("threshold", {"value": 1.0}, "value", 2.0, "compressor.value"),
    ("randomk", {"ratio": 0.1}, "ratio", 0.2, "compressor.ratio"),
    ("randomk", {"ratio": 0.1}, "seed", 1, "compressor.seed"),
    ("randomk", {}, "k", 5, "compressor.ratio"),
    ("randomk", {"ratio": 0.1}, "warmup_steps", 100, "compressor.warmup_steps"),
    ("randomk", {"ratio": 0.1}, "warmup_density", 0.5, "compressor.warmup_density"),
    ("error_feedback", {"inner": "topk"}, "inner", "signsgd", "compressor.inner"),
    ("error_feedback", {"inner": "topk"}, "inner", TopK(ratio=0.1), "compressor.inner.ratio"),
    ("error_feedback", {"inner": "topk"}, "momentum", 0.9, "compressor.momentum"),
    ("error_feedback", {"inner": "topk"}, "clip_norm", 1.0, "compressor.clip_norm"),
    (
        "error_feedback",
        {"inner": "topk"},
        "inner",
        TopK(warmup_steps=100),
        "compressor.inner.warmup_steps",
    ),
    ("diana", {"inner": "pquant"}, "inner", QSGD(), "compressor.inner"),
    ("diana", {"inner": "pquant"}, "alpha", 0.1, "compressor.alpha"),
    ("diana", {"inner": "pquant"}, "momentum", 0.5, "compressor.momentum"),
    ("pquant", {}, "p", "inf", "compressor.p"),
    ("pquant", {}, "block_size", 64, "compressor.block_size"),
    ("pquant", {}, "seed", 1, "compressor.seed"),
    ("onebit_adam", {}, "inner", QSGD(), "compressor.inner"),
    ("onebit_adam", {}, "warmup_steps", 7, "compressor.warmup_steps"),
    ("onebit_adam", {}, "beta1", 0.8, "compressor.beta1"),
    ("onebit_adam", {}, "beta2", 0.99, "compressor.beta2"),
    ("onebit_adam", {}, "epsilon", 1e-6, "compressor.epsilon"),
    ("powersgd", {}, "rank", 3, "compressor.rank"),
    ("powersgd", {}, "start_step", 5, "compressor.start_step"),
    ("powersgd", {}, "min_compression_rate", 3.0, "compressor.min_compression_rate"),
    ("powersgd", {}, "warm_start", False, "compressor.warm_start"),
    ("powersgd", {}, "error_feedback", False, "compressor.error_feedback"),
    ("powersgd", {}, "seed", 1, "compressor.seed"),
    ("gradiveq", {}, "slice_length", 256, "compressor.slice_length"),
    ("gradiveq", {}, "slice_size", 256, "compressor.slice_length"),
    ("gradiveq", {}, "components", 4, "compressor.components"),
    ("gradiveq", {}, "energy_loss", 0.05, "compressor.energy_loss"),
    ("gradiveq", {}, "energy", 0.9, "compressor.energy_loss"),
    ("gradiveq", {}, "kernels_only", False, "compressor.kernels_only"),
    ("gradiveq", {}, "warmup_steps", 5, "compressor.warmup_steps"),
    ("gradiveq", {}, "sampling_steps", 10, "compressor.sampling_steps"),
    ("gradiveq", {}, "sample_steps", 10, "compressor.sampling_steps"),
    ("gradiveq", {}, "compressed_steps", 10, "compressor.compressed_steps"),
    ("gradiveq", {}, "refit_steps", 8, "compressor.refit_steps"),
    ("gradiveq", {}, "sampling", "exact", "compressor.sampling"),
    ("gradiveq", {}, "sample_compressor", QSGD(bits=2), "compressor.sampling"),
    ("gradiveq", {}, "refresh_threshold", 0.5, "compressor.refresh_threshold"),
    ("gradiveq", {}, "refresh_on", "local", "compressor.refresh_on"),
    ("gradiveq", {}, "max_components", 8, "compressor.max_components"),
    ("gradiveq", {}, "sample_slices", 1, "compressor.sample_slices"),
    ("gradiveq", {}, "packs", 2, "compressor.packs"),
    ("gradiveq", {}, "seed", 1, "compressor.seed"),
    ("gradiveq", {}, "error_feedback", True, "compressor.error_feedback"),
    ("gradiveq", {}, "min_explained", 0.5, "compressor.min_explained"),
    ("deepreduce", {}, "sparsifier", RandomK(ratio=0.01), "compressor.sparsifier"),
    ("deepreduce", {}, "sparsifier", TopK(ratio=0.02), "compressor.sparsifier.ratio"),
    (
        "deepreduce",
        {},
        "sparsifier",
        TopK(ratio=0.01),  # DeepReduce()'s has a 100-step warm-up
        "compressor.sparsifier.warmup_steps",
    ),
    ("deepreduce", {}, "index_codec", "varint", "compressor.index_codec"),
    ("deepreduce", {}, "index_codec", "bloom", "compressor.index_codec"),
    ("deepreduce", {}, "value_codec", "raw", "compressor.value_codec"),
    ("deepreduce", {}, "seed", 1, "compressor.seed"),
    ("deepreduce", {}, "index_options", {"num_hashes": 3}, "compressor.index_options"),
    ("deepreduce", {}, "fpr", 1e-3, "compressor.index_options"),
    ("deepreduce", {}, "policy", "random", "compressor.index_options"),
    # DeflateValues' byte shuffle changes the stream; the Bloom filter's policy
    # (and DeepReduce's seed, above) the positions a receiver decodes.
    (
        "deepreduce",
        {"value_codec": "deflate"},
        "value_options",
        {"shuffle": False},
        "compressor.value_options",
    ),
    (
        "deepreduce",
        {"value_codec": DeflateValues()},
        "value_codec",
        DeflateValues(shuffle=False),
        "compressor.value_codec.shuffle",
    ),
    (
        "deepreduce",
        {"index_codec": BloomFilter()},
        "index_codec",
        BloomFilter(policy="random"),
        "compressor.index_codec.policy",
    ),
    ("switch", {"phases": [None, "qsgd"]}, "phases", [None, QSGD(bits=2)], "compressor.phases"),
    ("switch", {"phases": [None, "qsgd"]}, "initial_phase", 1, "compressor.initial_phase"),
]


def first_difference(ours, theirs) -> str:
    message = describe_difference([ours, theirs], this_worker=0)
    assert message is not None, "no difference found"
    return message.split(": ", 1)[1]


@pytest.mark.parametrize(
    ("name", "common", "option", "value", "named"),
    CHANGES,
    ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CHANGES)],
)
def test_every_compressor_option_is_compared(name, common, option, value, named):
    ours = settings_items(get(name, **common), POLICY)
    theirs = settings_items(get(name, **{**common, option: value}), POLICY)
    assert first_difference(ours, theirs).startswith(f"option {named!r} is ")


def test_the_table_covers_every_option_of_every_compressor():
    """A new compressor or option gets a row in CHANGES (and so a checked config)."""
    tested = {(name, option) for name, _, option, _, _ in CHANGES}
    common = {name: options for name, options, _, _, _ in CHANGES}
    missing = [
        (name, option)
        for name in registry.available()
        for option in inspect.signature(type(get(name, **common.get(name, {}))).__init__).parameters
        if option not in ("self", "args", "kwargs") and (name, option) not in tested
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("policy", "aggregation", "named"),
    [
        (CompressionPolicy(min_size=10), None, "policy.min_size"),
        (CompressionPolicy(max_size=10**6), None, "policy.max_size"),
        (CompressionPolicy(nonfinite="raise"), None, "policy.nonfinite"),
        (CompressionPolicy(min_compression_rate=2.0), None, "policy.min_compression_rate"),
        (POLICY, Aggregation(mode="allgather"), "aggregation.mode"),
        (POLICY, Aggregation(bucket_bytes=0), "aggregation.bucket_bytes"),
        (POLICY, Aggregation(pack_bytes=1 << 10), "aggregation.pack_bytes"),
    ],
)
def test_policy_and_aggregation_are_compared(policy, aggregation, named):
    ours = settings_items(QSGD(), POLICY)
    theirs = settings_items(QSGD(), policy, aggregation)
    assert first_difference(ours, theirs).startswith(f"option {named!r} is ")


def test_the_version_is_compared(monkeypatch):
    ours = settings_items(None, POLICY)
    monkeypatch.setattr(tfcompress, "__version__", "9.9.9")
    theirs = settings_items(None, POLICY)
    assert first_difference(ours, theirs) == (
        f"option 'tfcompress.version' is {ours[0][1]} on worker 0 and '9.9.9' on worker 1"
    )


def test_extra_items_are_compared():
    ours = settings_items(None, POLICY, extra={"schedule.starts": [0, 1]})
    theirs = settings_items(None, POLICY, extra={"schedule.starts": [0, 2]})
    assert first_difference(ours, theirs) == (
        "option 'schedule.starts' is [0, 1] on worker 0 and [0, 2] on worker 1"
    )


def test_a_compressor_of_another_class_is_named_once_without_its_options():
    ours = settings_items(QSGD(), POLICY)
    theirs = settings_items(None, CompressionPolicy(min_size=8))
    assert first_difference(ours, theirs) == (
        "option 'compressor' is QSGD on worker 0 and None on worker 1; "
        "option 'policy.min_size' is 1024 on worker 0 and 8 on worker 1"
    )


def test_describe_difference():
    a = [("x", "1"), ("y", "2"), ("z", "3"), ("w", "4"), ("v", "5")]
    b = [("x", "1"), ("y", "0"), ("z", "0"), ("w", "0"), ("v", "0"), ("u", "6")]
    assert describe_difference([a, a, a], this_worker=2) is None
    message = describe_difference([a, a, b, b], 3, this_worker_uses="THIS", hint="Do that")
    assert message == (
        f"{MISMATCH_PREFIX}: option 'y' is 2 on worker 0 and 0 on worker 2; "
        "option 'z' is 3 on worker 0 and 0 on worker 2; "
        "option 'w' is 4 on worker 0 and 0 on worker 2 (and 2 more option(s)); "
        "workers [2, 3] all differ from worker 0. This worker (3) uses THIS. Do that."
    )
    assert describe_difference([a, a + [("u", "6")]], 0).endswith(
        "option 'u' is not set on worker 0 and 6 on worker 1"
    )


def test_items_text_round_trip():
    items = settings_items(QSGD(), POLICY, extra={"note": "two\nlines=yes"})
    assert parse_items(settings_items_text(items)) == items
    assert len(settings_items_text(items).splitlines()) == len(items)


def test_module_doctests():
    failures, attempted = doctest.testmod(settings_module)
    assert failures == 0 and attempted > 0


class _SecondWorker:
    """A fake gather: this worker's row, then the row of a worker with ``items``."""

    def __init__(self, items):
        text = settings_items_text(items)
        self.data = np.frombuffer(text.encode(), np.uint8).astype(np.int64)
        self.header = np.array([[settings_module.settings_digest(text), self.data.size]])
        self.calls = 0

    def __call__(self, strategy, row):
        self.calls += 1
        if self.calls == 1:
            return np.concatenate([row, self.header])
        other = np.zeros_like(row)
        other[0, : self.data.size] = self.data
        return np.concatenate([row, other])


def test_check_gathers_the_text_only_when_the_digests_differ(monkeypatch):
    strategy = make("qsgd")
    monkeypatch.setattr(settings_module.internal, "num_workers", lambda s: 2)
    ours = settings_items(QSGD(levels=16), POLICY)
    same = _SecondWorker(ours)
    monkeypatch.setattr(settings_module, "_gather_rows", same)
    check_same_settings(strategy, ours)
    assert same.calls == 1
    other = _SecondWorker(settings_items(QSGD(levels=4), POLICY))
    monkeypatch.setattr(settings_module, "_gather_rows", other)
    with pytest.raises(ValueError) as raised:
        check_same_settings(strategy, ours, this_worker_uses="QSGD(16)", hint="Fix it")
    assert other.calls == 2
    assert str(raised.value) == (
        f"{MISMATCH_PREFIX}: option 'compressor.levels' is 16 on worker 0 and 4 on worker 1. "
        "This worker (0) uses QSGD(16). Fix it."
    )


def test_check_is_eager_only_on_several_workers(monkeypatch):
    strategy = make("qsgd")
    items = settings_items(QSGD(), POLICY)
    tf.function(lambda: check_same_settings(strategy, items))()  # one worker: nothing to do
    monkeypatch.setattr(settings_module.internal, "num_workers", lambda s: 2)
    with pytest.raises(RuntimeError, match="outside tf.function"):
        tf.function(lambda: check_same_settings(strategy, items))()


def test_set_compression_and_check_settings_on_one_worker_gather_nothing(monkeypatch):
    strategy = make("qsgd")

    def no_gather(*args):
        raise AssertionError("a single worker has nothing to compare")

    monkeypatch.setattr(settings_module, "_gather_rows", no_gather)
    tfcompress.distribute.set_compression(strategy, "fp16")
    tfcompress.distribute.check_settings(strategy, extra={"anything": 1})
    assert repr(tfcompress.distribute.compression_of(strategy)) == "FP16(dtype='float16')"


def test_set_compression_checks_before_it_changes_anything(monkeypatch):
    strategy = make("qsgd")
    monkeypatch.setattr(settings_module.internal, "num_workers", lambda s: 2)
    other = _SecondWorker(settings_items(get("signsgd"), CompressionPolicy(min_size=4)))
    monkeypatch.setattr(settings_module, "_gather_rows", other)
    with pytest.raises(ValueError, match="option 'compressor' is TopK on worker 0 and SignSGD"):
        tfcompress.distribute.set_compression(strategy, "topk")
    assert isinstance(tfcompress.distribute.compression_of(strategy), QSGD)
