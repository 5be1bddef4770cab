"""Test setup shared by all tests.

Two logical CPU devices are configured before TensorFlow initialises, so the
in-process ``MirroredStrategy`` tests have two replicas on any machine.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
if _cpus:
    try:
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    except RuntimeError:  # already initialised by an earlier import
        pass
