"""Switch: the standard tests on every phase, and the phase variable."""

import numpy as np
import pytest
import tensorflow as tf

from tests.compressors.conformance import (
    CompressorConformance,
    context_for,
    random_tensor,
    sum_payloads,
)
from tfcompress.compressors import QSGD, ErrorFeedback, Identity, Switch, TopK
from tfcompress.compressors.sparsifier import selected_count


class TestSwitchConformance(CompressorConformance):
    """Switch([None, QSGD, ErrorFeedback(TopK)]): exact, stochastic and stateful phases.

    A Switch compresses nothing itself (one payload format per phase), so
    every standard test runs on a bound Switch's branches.
    """

    num_branches = 3
    usable_unbound = False
    num_variables = 2  # QSGD's step counter, the error memory

    def make(self):
        return Switch([None, QSGD(bits=4, bucket_size=16, seed=5), ErrorFeedback(TopK(ratio=0.25))])

    def expected_branch_payload_nbytes(self, shape, dtype, branch):
        n = int(np.prod(shape))
        if branch == 0:
            return n * dtype.size
        if branch == 1:
            return 4 * -(-n // 16) + (n * 5 + 7) // 8
        return selected_count(0.25, n) * (dtype.size + 4)

    def tolerance(self, dtype, variant):
        return 0.0 if variant.branch == 0 else None  # the uncompressed phase is exact

    def needs_static_shape(self, variant):
        return variant.branch == 2  # the error memory has the tensor's shape

    def test_config_is_reconstructible(self, variant):
        c = self.bound(variant, (10,), tf.float32)
        again = Switch([None, "qsgd"], initial_phase=1)
        assert type(c) is Switch and c.get_config() == self.make().get_config()
        assert again.get_config() == {"phases": ["Identity()", repr(QSGD())], "initial_phase": 1}


def test_the_schedule_reads_the_phase_set_between_steps():
    switch = Switch([None, "fp16"], initial_phase=1)
    schedule = switch.schedule(0, 2, None)
    assert schedule.num_branches == 2 and int(schedule.branch_index()) == 1
    bound = switch.bind(context_for((4,), tf.float32))
    switch.set_phase(0)
    assert int(schedule.branch_index()) == 0 and switch.phase == 0
    assert bound.phase_variable is switch.phase_variable  # one phase per Switch
    assert schedule.variables == (switch.phase_variable,)
    with pytest.raises(ValueError, match="out of range"):
        switch.set_phase(2)


def test_each_phase_keeps_its_own_state_across_switches():
    switch = Switch([ErrorFeedback(TopK(k=1)), ErrorFeedback(TopK(k=2))])
    bound = switch.bind(context_for((4,), tf.float32))
    x = tf.constant([4.0, 3.0, 2.0, 1.0])
    first = bound.branch(0)
    first.decompress(first.compress(x))
    bound.branch(1).compress(x)
    np.testing.assert_array_equal(bound.variables[0].numpy(), [0.0, 3.0, 2.0, 1.0])
    np.testing.assert_array_equal(bound.variables[1].numpy(), [0.0, 0.0, 2.0, 1.0])
    assert bound.branch(0) is first  # bound once, kept


def test_the_phases_are_summed_like_the_strategy_does():
    bound = Switch([None, "fp16"]).bind(context_for((64,), tf.float32))
    xs = [random_tensor((64,), tf.float32, seed=s) for s in range(2)]
    for j in range(2):
        view = bound.branch(j)
        got = view.decompress(sum_payloads([view.compress(x) for x in xs]))
        np.testing.assert_allclose(got.numpy(), tf.add_n(xs).numpy(), rtol=2**-10, atol=2**-10)


def test_none_is_the_exact_phase_and_switch_compresses_nothing_itself():
    switch = Switch([None])
    assert isinstance(switch.phases[0], Identity)
    with pytest.raises(TypeError, match="one payload format per phase"):
        switch.compress(tf.ones([3]))
