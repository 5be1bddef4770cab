"""Standard tests every compressor inherits (round trip, tf.function, checkpoint, summable).

A compressor's test module subclasses :class:`CompressorConformance` and
implements ``make()``; optional hooks describe its payload size, accuracy,
phases and state.

Every standard test runs on each *variant* of the compressor:

* ``unbound``: ``make()`` used directly, as in eager code and tests;
* ``bound``: ``make().bind(TensorContext(...))`` for replica 0 of 2, with
  the test tensor's shape and dtype, as the strategy binds it;
* ``bound-branch<j>``: for phased compressors (``num_branches > 1``), the
  bound compressor's ``branch(j)`` for every phase ``j`` of its schedule.

A stateless compressor is its own bound form (``bind`` returns it), so it has
the unbound variant only.

The tests that run ops (round trips, the summable claim, tf.function) run with
the C++ kernels and with the pure-TF references (the ``implementation``
fixture, the ``impl`` fixture of ``tests/conftest.py`` parametrized per
variant). To keep the suite fast, the full shape x dtype matrix runs on the
first variant with the default implementation; the variants run on one shape
and every dtype; and the traced test (tracing is its cost) runs every variant
with the kernels and the first one with the references.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tfcompress.codecs
import tfcompress.compressors
from tfcompress import ops
from tfcompress.compressors import Compressor, TensorContext, get, payload_nbytes, sum_in_process

SHAPES = [(0,), (1,), (7,), (3, 5), (4, 3, 3, 2), (1025,)]
DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
#: The shape of the round trips of every variant and implementation.
VARIANT_SHAPE = (4, 3, 3, 2)
#: How many replicas a bound compressor believes there are (it is replica 0).
NUM_REPLICAS = 2
#: Tests that trace: the references run on the first variant only.
TRACED_TESTS = ("test_tf_function_matches_eager",)


def random_tensor(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tf.cast(tf.constant(rng.normal(size=shape).astype(np.float64)), dtype)


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a standard test uses the compressor (see the module docstring)."""

    bound: bool
    branch: int = 0
    phased: bool = False

    def __str__(self) -> str:
        if not self.bound:
            return "unbound"
        return f"bound-branch{self.branch}" if self.phased else "bound"


def context_for(shape, dtype, key: str = "conformance#0") -> TensorContext:
    """The context the standard tests bind to: replica 0 of 2 (``shape=None``: unknown)."""
    return TensorContext(
        key=key,
        replica=0,
        num_replicas=NUM_REPLICAS,
        shape=None if shape is None else tf.TensorShape(shape),
        dtype=dtype,
    )


#: The names a compressor's repr may use: every compressor and codec class.
REPR_NAMESPACE = {**vars(tfcompress.codecs), **vars(tfcompress.compressors)}


def config_tree(value):
    """``value`` with every compressor or codec replaced by (class name, its config), recursively.

    Two compressors are the same compressor when their trees are equal: the
    settings check compares the same options across workers.
    """
    if callable(getattr(value, "get_config", None)) and not isinstance(value, type):
        return (type(value).__name__, config_tree(value.get_config()))
    if isinstance(value, dict):
        return {k: config_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [config_tree(v) for v in value]
    return value


def check_repr_evaluates_back(compressor: Compressor) -> Compressor:
    """``eval(repr(c))`` is a compressor of ``c``'s class and config, with ``c``'s repr."""
    text = repr(compressor)
    again = eval(text, dict(REPR_NAMESPACE))
    assert type(again) is type(compressor), text
    assert config_tree(again) == config_tree(compressor), text
    assert repr(again) == text
    return again


def sum_payloads(payloads):
    """What the collective all-reduce makes of summable payloads."""
    return payloads[0].replace(
        {k: tf.add_n([p.tensors[k] for p in payloads]) for k in payloads[0].tensors}
    )


class CompressorConformance:
    """Subclass and implement ``make``; set the class attributes that apply."""

    #: relative tolerance of one round trip, per dtype name (None: no check).
    round_trip_rtol: dict = {}
    #: Branches of the bound compressor: its schedule's ``num_branches`` (phased compressors).
    num_branches: int = 1
    #: False for compressors that only work bound (Switch: one payload format per phase).
    usable_unbound: bool = True
    #: Variables after one compress/decompress (None: not checked).
    num_variables: int | None = None
    #: Shape of the summable claim's tensors.
    summable_claim_shape: tuple = (64,)

    def make(self) -> Compressor:
        raise NotImplementedError

    def expected_payload_nbytes(self, shape, dtype) -> int | None:
        """Payload size formula; None when the compressor does not promise one."""
        return None

    # -- hooks of phased and stateful compressors ---------------------------------------------

    def expected_branch_payload_nbytes(self, shape, dtype, branch: int) -> int | None:
        """Payload size of phase ``branch`` (phase 0: :meth:`expected_payload_nbytes`)."""
        return self.expected_payload_nbytes(shape, dtype) if branch == 0 else None

    def expected_variant_payload_nbytes(self, shape, dtype, variant: Variant) -> int | None:
        """Payload size of ``variant`` (default: its branch's, bound or not)."""
        return self.expected_branch_payload_nbytes(shape, dtype, variant.branch)

    def tolerance(self, dtype: tf.DType, variant: Variant) -> float | None:
        """Relative tolerance of one round trip of ``variant`` (None: no check)."""
        del variant
        return self.round_trip_rtol.get(dtype.name)

    def needs_static_shape(self, variant: Variant) -> bool:
        """True when ``variant`` rejects tensors of unknown static shape (its state needs one)."""
        del variant
        return False

    def usable(self, variant: Variant, shape, dtype: tf.DType) -> bool:
        """Whether ``variant`` accepts tensors of ``shape`` and ``dtype``."""
        del variant, shape
        return dtype in self.make().supported_dtypes

    # -- building the compressor under test ---------------------------------------------------

    def variants(self) -> list[Variant]:
        """The variants the standard tests run (see the module docstring)."""
        found = [Variant(bound=False)] if self.usable_unbound else []
        phased = self.num_branches > 1
        if phased or self.make().stateful or not found:
            found += [Variant(True, j, phased) for j in range(self.num_branches)]
        return found

    def pytest_generate_tests(self, metafunc):
        """Parametrizes ``variant`` (and ``implementation``) per class (pytest calls this)."""
        names = metafunc.fixturenames
        if "variant" not in names:
            return
        variants = self.variants()
        if "implementation" not in names:
            metafunc.parametrize("variant", variants, ids=str)
            return
        references = variants[:1] if metafunc.function.__name__ in TRACED_TESTS else variants
        pairs = [(v, "kernel") for v in variants] + [(v, "reference") for v in references]
        metafunc.parametrize(
            ["variant", "implementation"],
            pairs,
            ids=[f"{v}-{name}" for v, name in pairs],
            indirect=["implementation"],
        )

    @pytest.fixture
    def implementation(self, request):
        """The kernels or the references, as ``impl`` in tests/conftest.py (parametrized above)."""
        if request.param == "kernel":
            request.getfixturevalue("kernel_library")
        with ops.implementation(request.param):
            yield request.param

    def bound(self, variant: Variant, shape, dtype) -> Compressor:
        """``make()``, bound to replica 0 of 2 with ``shape`` and ``dtype`` for bound variants."""
        c = self.make()
        return c.bind(context_for(shape, dtype)) if variant.bound else c

    def build(self, variant: Variant, shape, dtype=tf.float32) -> Compressor:
        """The compressor a test runs: the bound compressor's branch for bound variants."""
        owner = self.bound(variant, shape, dtype)
        return owner.branch(variant.branch) if variant.bound else owner

    def require(self, variant: Variant, shape, dtype) -> None:
        """Skips the test when ``variant`` does not take tensors of ``shape`` and ``dtype``."""
        if not self.usable(variant, shape, dtype):
            pytest.skip(f"{variant} does not take {dtype.name}{list(shape)}")

    @staticmethod
    def round_trip(c: Compressor, x: tf.Tensor) -> tf.Tensor:
        """What the cross-device ops make of one worker's tensor (decode or aggregate).

        Summable compressors go through every all-reduce round
        (:func:`~tfcompress.compressors.sum_in_process` with one worker).
        """
        if c.summable:
            return sum_in_process([c], [x])[0]
        return c.aggregate([c.compress(x)])

    # -- the standard tests ---------------------------------------------------------------------

    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
    def test_round_trip_shape_and_dtype(self, shape, dtype):
        """Every shape and dtype, on the first variant (the compressor used directly)."""
        self.check_round_trip(self.variants()[0], shape, dtype)

    def test_round_trip_of_every_variant(self, variant, implementation):
        """Every variant (bound, every phase), with the kernels and the references."""
        del implementation
        ran = 0
        for dtype in DTYPES:
            if self.usable(variant, VARIANT_SHAPE, dtype):
                self.check_round_trip(variant, VARIANT_SHAPE, dtype)
                ran += 1
        assert ran > 0, f"{variant} accepts no dtype"

    def check_round_trip(self, variant, shape, dtype):
        """One round trip: the shape and dtype survive, within the tolerance."""
        self.require(variant, shape, dtype)
        c = self.build(variant, shape, dtype)
        x = random_tensor(shape, dtype)
        y = self.round_trip(c, x)
        assert y.shape == x.shape
        assert y.dtype == x.dtype
        rtol = self.tolerance(dtype, variant)
        if rtol is not None and np.prod(shape) > 0:
            xs = x.numpy().astype(np.float64)
            np.testing.assert_allclose(y.numpy().astype(np.float64), xs, rtol=rtol, atol=rtol)

    @pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
    def test_payload_nbytes_formula(self, variant, dtype):
        if dtype not in self.make().supported_dtypes:
            pytest.skip(f"{dtype.name} not supported")
        checked = 0
        for shape in SHAPES:
            if not self.usable(variant, shape, dtype):
                continue
            expected = self.expected_variant_payload_nbytes(shape, dtype, variant)
            if expected is None:
                pytest.skip("no payload size formula")
            c = self.build(variant, shape, dtype)  # one per tensor: state has its shape
            assert int(payload_nbytes(c.compress(random_tensor(shape, dtype)))) == expected
            checked += 1
        assert checked > 0

    def test_tf_function_matches_eager(self, variant, implementation):
        """Two fresh compressors: one eager, one traced, step after step (state evolves alike)."""
        del implementation
        shape = (6, 7)
        self.require(variant, shape, tf.float32)
        x = random_tensor(shape, tf.float32, seed=3)
        eager = self.bound(variant, shape, tf.float32)
        graph = self.bound(variant, shape, tf.float32)
        eager_view = eager.branch(variant.branch) if variant.bound else eager
        graph_view = graph.branch(variant.branch) if variant.bound else graph
        fn = tf.function(lambda t: self.round_trip(graph_view, t))
        for _ in range(3):
            np.testing.assert_array_equal(self.round_trip(eager_view, x).numpy(), fn(x).numpy())
        for a, b in zip(eager.variables, graph.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())

    def test_unknown_static_shape_in_tf_function(self, variant):
        def run():
            c = self.build(variant, [None, 3])
            fn = tf.function(
                lambda t: self.round_trip(c, t),
                input_signature=[tf.TensorSpec([None, 3], tf.float32)],
            )
            return fn(random_tensor((4, 3), tf.float32))

        if self.needs_static_shape(variant):
            with pytest.raises(ValueError, match="static"):
                run()
        else:
            assert run().shape == (4, 3)

    def test_scalar_and_empty_tensors(self, variant):
        """A 0-d tensor in every dtype and an empty 2-D one survive the round trip.

        (Empty 1-D tensors are in :data:`SHAPES`.) Variants that do not take a
        case say so through :meth:`usable`; at least the float32 scalar must run.
        """
        cases = [((), dtype) for dtype in DTYPES] + [((2, 0), tf.float32)]
        ran = [case for case in cases if self.usable(variant, *case)]
        assert ((), tf.float32) in ran, f"{variant} does not take a float32 scalar"
        for shape, dtype in ran:
            self.check_round_trip(variant, shape, dtype)

    @pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.bool], ids=lambda d: d.name)
    def test_rejects_non_float(self, variant, dtype):
        """Integer gradients never reach a compressor; one that does is named with its dtype."""
        c = self.build(variant, (3,), tf.float32)
        with pytest.raises(TypeError, match=rf"compresses floating tensors.*dtype {dtype.name}"):
            c.compress(tf.zeros([3], dtype))
        if dtype == tf.int32:  # in a graph, the tensor is named too (one trace is enough)
            traced = tf.function(lambda t: c.compress(tf.identity(t, name="step_count")))
            with pytest.raises(TypeError, match=r"`step_count:0` of dtype int32"):
                traced.get_concrete_function(tf.TensorSpec([3], dtype))

    def test_summable_claim(self, variant, implementation):
        """The aggregation path the strategy takes sums what the workers sent.

        Summable: the decoded sum of payloads is the sum of the inputs (within
        the round-trip tolerance), or of the decoded payloads for lossy ones.
        Not summable: ``aggregate`` is the sum of the inputs (within the
        tolerance), or exactly the sum of the decoded payloads for lossy ones.
        """
        del implementation
        shape = self.summable_claim_shape
        c = self.build(variant, shape, tf.float32)
        xs = [random_tensor(shape, tf.float32, seed=s) for s in range(3)]
        rtol = self.tolerance(tf.float32, variant)
        if c.rounds > 1:
            # Several rounds: each worker's share (decompress after the last
            # round) sums to the decoded sum; the shares need the rounds.
            got = self.summed_shares_match(c, xs)
            decoded = got
        else:
            payloads = [c.compress(x) for x in xs]
            if rtol is None:
                decoded = tf.add_n([c.decompress(p) for p in payloads])
            got = c.decompress(sum_payloads(payloads)) if c.summable else c.aggregate(payloads)
        if rtol is not None:
            tolerance = max(rtol * 3, 1e-6)
            np.testing.assert_allclose(
                got.numpy(), tf.add_n(xs).numpy(), rtol=tolerance, atol=tolerance
            )
        elif c.summable:
            np.testing.assert_allclose(got.numpy(), decoded.numpy(), rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got.numpy(), decoded.numpy())

    @staticmethod
    def summed_shares_match(c: Compressor, xs: list[tf.Tensor]) -> tf.Tensor:
        """Multi-round: runs the rounds by hand; each worker's share sums to ``finish``."""
        own = [c.compress(x) for x in xs]
        for r in range(1, c.rounds):
            summed = sum_payloads(own)
            own = [c.next_round(r, p, summed) for p in own]
        total = c.finish(own[0], sum_payloads(own))
        shares = tf.add_n([c.decompress(p) for p in own])
        np.testing.assert_allclose(total.numpy(), shares.numpy(), rtol=1e-5, atol=1e-5)
        return total

    def test_checkpoint_round_trip(self, variant, tmp_path):
        shape = (10,)
        self.require(variant, shape, tf.float32)
        owner = self.bound(variant, shape, tf.float32)
        c = owner.branch(variant.branch) if variant.bound else owner
        self.round_trip(c, random_tensor(shape, tf.float32))
        if self.num_variables is not None:
            assert len(owner.variables) == self.num_variables
        schedule = owner.schedule(0, NUM_REPLICAS, None)
        state = list(owner.variables) + ([] if schedule is None else list(schedule.variables))
        ckpt = tf.train.Checkpoint(state=state)
        path = ckpt.save(str(tmp_path / "ckpt"))
        before = [v.numpy().copy() for v in state]
        for v in state:
            v.assign(tf.zeros_like(v))
        ckpt.restore(path).assert_consumed()
        for v, b in zip(state, before, strict=True):
            np.testing.assert_array_equal(v.numpy(), b)

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = get(c.name, **c.get_config())
        assert type(again) is type(self.make())
        assert again.get_config() == c.get_config()

    def test_repr_evaluates_back(self):
        """``repr`` is the constructor call: evaluated, it makes the same compressor."""
        check_repr_evaluates_back(self.make())

    def test_bind_and_branches(self):
        """One bind protocol, and one view per phase of the schedule.

        A stateless compressor is its own bound form; a stateful one binds a
        copy that knows its context. ``num_branches`` is the schedule's.
        """
        c = self.make()
        context = context_for(VARIANT_SHAPE, tf.float32)
        bound = c.bind(context)
        if c.stateful:
            assert bound is not c and bound.is_bound and bound.context == context
            assert not c.is_bound
        else:
            assert bound is c
        schedule = c.schedule(0, NUM_REPLICAS, None)
        assert (schedule is None) == (self.num_branches == 1)
        if schedule is not None:
            assert schedule.num_branches == self.num_branches
            assert 0 <= int(schedule.branch_index()) < self.num_branches
        for j in range(self.num_branches):
            assert isinstance(bound.branch(j), Compressor)
        with pytest.raises(ValueError):
            bound.branch(self.num_branches)


class SeededStochasticConformance(CompressorConformance):
    """Conformance for seeded stochastic, non-summable compressors (QSGD, TernGrad).

    Each ``compress`` draws fresh noise from (seed, step), so the standard
    tf.function test compares two instances with one seed, the summable claim
    is the exact sum of the decoded payloads (and, statistically, an unbiased
    estimate of the sum), and the checkpointed state is the step counter.
    """

    num_variables = 1

    def test_aggregate_is_an_unbiased_estimate_of_the_sum(self):
        c = self.make().bind(context_for((64,), tf.float32))
        assert not c.summable
        if not c.unbiased:
            pytest.skip(f"{c!r} is biased (the standard summable claim still holds)")
        xs = [random_tensor((64,), tf.float32, seed=s) for s in range(3)]
        rounds = tf.function(lambda: c.aggregate([c.compress(x) for x in xs]))
        samples = np.stack([rounds().numpy() for _ in range(300)]).astype(np.float64)
        want = tf.add_n(xs).numpy()
        standard_error = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
        assert np.all(np.abs(samples.mean(axis=0) - want) <= 5 * standard_error + 1e-5)
