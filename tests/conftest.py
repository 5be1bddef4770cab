"""Test setup shared by all tests.

Two logical CPU devices are configured before TensorFlow initialises, so the
in-process ``MirroredStrategy`` tests have two replicas on any machine. The
environment guard (:mod:`tests.environment_guard`) fails any test that
installs or removes a package in the environment the suite runs in.
"""

import os
import shlex
import shutil

import pytest

pytest_plugins = ["tests.environment_guard"]

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


@pytest.fixture(scope="module")
def kernel_library():
    """Builds (or finds) and loads the op library; skips only where no compiler exists
    and the install carries no prebuilt library (a platform wheel's)."""
    from tfcompress.ops import _loader, _prebuilt

    compiler = shlex.split(os.environ.get("CXX") or "g++")
    no_compiler = not compiler or shutil.which(compiler[0]) is None
    if no_compiler and _prebuilt.find() is None:
        pytest.skip(f"no C++ compiler ({compiler[:1]}); the kernel cannot be built")

    return _loader.load_library()  # a failing build fails the tests that need it


@pytest.fixture(params=["kernel", "reference"])
def impl(request):
    """Runs a test once with the C++ kernels and once with the pure-TF references."""
    from tfcompress import ops

    if request.param == "kernel":
        request.getfixturevalue("kernel_library")
    with ops.implementation(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _restore_ops_switch():
    """Every test starts from the environment's kernel/reference choice."""
    yield
    from tfcompress import ops

    ops.set_implementation(None)
