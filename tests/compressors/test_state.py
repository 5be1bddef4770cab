import numpy as np
import tensorflow as tf

import tfcompress
from tfcompress.compressors import local_variable, stateless_seed


def test_local_variable_is_not_mirrored_inside_a_strategy_scope():
    strategy = tfcompress.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = tf.Variable(1.0)
        local = local_variable(tf.constant(2.0), name="state", device="/cpu:1")
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    assert not isinstance(local, tf.distribute.DistributedValues)
    assert "CPU:1" in local.device


def test_local_variable_created_while_tracing():
    made = []

    @tf.function
    def fn():
        if not made:
            made.append(local_variable(lambda: tf.constant(0, tf.int64), name="counter"))
        return made[0].assign_add(1)

    assert int(fn()) == 1 and int(fn()) == 2


def test_stateless_seed_is_deterministic_and_separates_streams():
    step = tf.constant(3, tf.int64)
    a = stateless_seed(7, "k", step, replica=0).numpy()
    np.testing.assert_array_equal(a, stateless_seed(7, "k", step, replica=0).numpy())
    assert a[1] == 3
    others = [
        stateless_seed(8, "k", step, 0),
        stateless_seed(7, "j", step, 0),
        stateless_seed(7, "k", step, 1),
        stateless_seed(7, "k", step, None),
    ]
    assert all(o.numpy()[0] != a[0] for o in others)
