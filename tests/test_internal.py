"""TensorFlow's private distribute API is used from one module only."""

import pathlib
import re

import tensorflow as tf

from tfcompress import _internal as internal

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tfcompress"


def test_private_imports_live_in_one_module():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_tf_internal.py":
            continue
        text = path.read_text()
        if re.search(r"tensorflow\.python\.distribute", text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == [], f"private TF distribute imports outside _tf_internal.py: {offenders}"


def test_private_names_still_exist():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert hasattr(strategy.extended, "_cross_device_ops")
    ops = internal.CollectiveAllReduce(
        ["/cpu:0"], 1, tf.distribute.experimental.CommunicationOptions()
    )
    args = internal.collective_init_args(ops)
    assert set(args) == {
        "devices",
        "group_size",
        "options",
        "collective_keys",
        "canonicalize_devices",
    }
    assert hasattr(ops, "_launchers") and hasattr(ops._launchers[0], "_all_gather")
    assert hasattr(ops._launchers[0], "batch_all_reduce")
    assert internal.devices_of(ops) and internal.group_size_of(ops) == 1
