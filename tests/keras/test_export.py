"""Models trained with compression export cleanly and serve where tfcompress is absent.

In process: tf-keras and Keras 3 models trained under a 2-replica tfcompress
``MirroredStrategy`` (C++ kernels in the training graph, ``CompressionMonitor``
so that the model tracks the compressor state) are saved in every format; one
fresh process, in which ``import tfcompress`` fails, loads them all and
predicts. Then real 2-worker runs in which the chief exports.

"Predicts the same" means: the loaded model computes with weights bit-identical
to the trained ones, and its predictions match the training process's within
a few ulps (``tests/numerics.py``: another process may pick other kernels, so
bit-identity of the outputs is not something TensorFlow promises).
"""

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import tfcompress
from tests.keras_models import small_conv_net
from tests.multiworker import ROOT, WORKERS, run_workers
from tests.numerics import assert_same_predictions
from tfcompress import ops
from tfcompress.keras.callbacks import CompressionMonitor
from tfcompress.keras.state import STATE_ATTRIBUTE

DEVICES = ["/cpu:0", "/cpu:1"]
PREFIX = ops.op_name("")  # "TFCompress>"

# A stateless compressor without a kernel, and two stateful ones whose
# kernels (TopK, QSGD) run in the training graph. (Plain QSGD, once a fourth
# row, adds nothing DIANA(QSGD) does not cover: dropped for CI time.)
COMPRESSORS = {
    "fp16": lambda: tfcompress.compressors.FP16(),
    "ef_topk": lambda: tfcompress.compressors.ErrorFeedback(
        tfcompress.compressors.TopK(ratio=0.05)
    ),
    "diana_qsgd": lambda: tfcompress.compressors.DIANA(tfcompress.compressors.QSGD(bits=4)),
}
FORMATS = {
    "tf_keras": ["tf_keras_model_save", "tf_saved_model_save"],
    "keras3": ["keras3_model_export", "keras3_model_save_keras", "tf_saved_model_save"],
}
EXPORTS = [
    f"{name}/{flavour}/{fmt}"
    for name in COMPRESSORS
    for flavour, formats in FORMATS.items()
    for fmt in formats
]

rng = np.random.default_rng(0)
X = rng.normal(size=(96, 10, 10, 1)).astype("float32")
Y = rng.integers(0, 4, size=96).astype("int32")
INPUTS = X[:16]


def build_and_train(keras_module, strategy):
    with strategy.scope():
        model = small_conv_net(keras_module, 10)
    # The monitor makes the model track the compressor state (for checkpoints):
    # the exports below must still leave it out.
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0, callbacks=[CompressionMonitor()])
    assert getattr(model, STATE_ATTRIBUTE).state is tfcompress.distribute.compression_state(
        strategy
    )
    return model


def graph_op_types(graph_def) -> set[str]:
    """Op types of a GraphDef's nodes and of every function in its library."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
    return types


def saved_model_op_types(directory) -> set[str]:
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((pathlib.Path(directory) / "saved_model.pb").read_bytes())
    types = set()
    for meta_graph in saved_model.meta_graphs:
        types |= graph_op_types(meta_graph.graph_def)
    return types


def keras_file_members_mentioning_tfcompress(path) -> list[str]:
    """Members of a .keras archive whose bytes contain 'tfcompress', any case."""
    with zipfile.ZipFile(path) as archive:
        return [n for n in archive.namelist() if b"tfcompress" in archive.read(n).lower()]


def saved_variables_of_tfcompress(directory) -> list[str]:
    """Keys of a SavedModel's variables checkpoint that belong to tfcompress."""
    reader = tf.train.load_checkpoint(str(pathlib.Path(directory) / "variables" / "variables"))
    return sorted(k for k in reader.get_variable_to_shape_map() if "tfcompress" in k.lower())


def tf_keras_train_op_types(model) -> set[str]:
    # tf-keras keeps its train step as a tf.function; its traced graphs show
    # which ops training ran.
    types = set()
    for concrete in model.train_function._list_all_concrete_functions():
        types |= graph_op_types(concrete.graph.as_graph_def())
    return types


@pytest.fixture(scope="module")
def exported(tmp_path_factory, kernel_library):
    """Trains and exports every (compressor, Keras, format); serves all in one fresh process."""
    import keras
    import tf_keras

    root = tmp_path_factory.mktemp("exports")
    np.save(root / "inputs.npy", INPUTS)
    manifest, references, weights, train_ops = [], {}, {}, {}
    with ops.implementation("kernel"):
        for name, make in COMPRESSORS.items():
            for flavour, keras_module in (("tf_keras", tf_keras), ("keras3", keras)):
                strategy = tfcompress.distribute.MirroredStrategy(
                    DEVICES, compression=make(), policy=64
                )
                model = build_and_train(keras_module, strategy)
                assert tfcompress.distribute.traffic_stats(strategy)["bytes_compressible"] > 0
                if flavour == "tf_keras":
                    train_ops[name] = tf_keras_train_op_types(model)
                reference = model.predict(INPUTS, verbose=0)
                for fmt in FORMATS[flavour]:
                    key = f"{name}/{flavour}/{fmt}"
                    path = root / key.replace("/", "-")
                    if fmt == "tf_keras_model_save":
                        model.save(str(path))
                        kind = "tf_keras_saved_model"
                    elif fmt == "tf_saved_model_save":
                        tf.saved_model.save(model, str(path))
                        kind = "saved_model"
                    elif fmt == "keras3_model_export":
                        model.export(str(path), verbose=False)
                        kind = "saved_model"
                    else:
                        path = path.with_suffix(".keras")
                        model.save(str(path))
                        kind = "keras_file"
                    manifest.append(
                        {
                            "name": key,
                            "kind": kind,
                            "path": str(path),
                            "inputs": str(root / "inputs.npy"),
                        }
                    )
                    references[key] = reference
                    weights[key] = model.get_weights()
    (root / "manifest.json").write_text(json.dumps(manifest))
    served = serve_without_tfcompress(root / "manifest.json", root / "served.npz")
    return {"manifest": {e["name"]: e for e in manifest}, "references": references,
            "weights": weights, "served": served, "train_ops": train_ops}  # fmt: skip


def numbered_weights(arrays, prefix: str) -> list[np.ndarray]:
    """The arrays keyed ``<prefix>weight0``, ``<prefix>weight1``, ... in order."""
    count = sum(1 for k in arrays if k.startswith(f"{prefix}weight"))
    return [arrays[f"{prefix}weight{i}"] for i in range(count)]


def assert_serves_the_trained_model(served, name, reference, weights) -> None:
    """The same weights bit for bit, and the same predictions within a few ulps."""
    got = numbered_weights(served, f"{name}:")
    assert len(got) == len(weights), f"{name}: {len(got)} weights served, {len(weights)} trained"
    for i, (g, w) in enumerate(zip(got, weights, strict=True)):
        np.testing.assert_array_equal(g, w, err_msg=f"{name}: weight {i}")
    assert_same_predictions(served[name], reference, name=name)


def serve_without_tfcompress(manifest, output) -> dict[str, np.ndarray]:
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    environment.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "export_worker.py"), "serve", str(manifest), str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(pathlib.Path(output).parent),
        env=environment,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with np.load(output) as data:
        return {k: data[k] for k in data.files}


def test_training_graph_used_the_custom_kernels(exported):
    # Otherwise the checks below would be vacuous for the kernel ops.
    for name in ("ef_topk", "diana_qsgd"):
        assert any(t.startswith(PREFIX) for t in exported["train_ops"][name]), name


@pytest.mark.parametrize("key", EXPORTS)
def test_serves_without_tfcompress_and_predicts_the_same(exported, key):
    served, reference, weights = (
        exported["served"],
        exported["references"][key],
        exported["weights"][key],
    )
    assert_serves_the_trained_model(served, key, reference, weights)
    if key.endswith("tf_keras_model_save"):
        assert_serves_the_trained_model(served, key + ":load_model", reference, weights)


@pytest.mark.parametrize("key", EXPORTS)
def test_no_custom_op_in_the_export(exported, key):
    path = exported["manifest"][key]["path"]
    if path.endswith(".keras"):  # weights and a config, no graph
        assert keras_file_members_mentioning_tfcompress(path) == []
    else:
        custom = sorted(t for t in saved_model_op_types(path) if t.startswith(PREFIX))
        assert custom == [], f"{key}: custom ops in the exported graph: {custom}"


@pytest.mark.parametrize(
    "key",
    [k for k in EXPORTS if not k.endswith("keras3_model_save_keras")],
)
def test_no_compressor_state_in_the_export(exported, key):
    path = exported["manifest"][key]["path"]
    assert saved_variables_of_tfcompress(path) == []


def chief_reference(directory) -> tuple[np.ndarray, list[np.ndarray]]:
    """The chief's reference predictions and trained weights (export_worker.py train)."""
    with np.load(directory / "weights.npz") as data:
        weights = numbered_weights(data, "")
    return np.load(directory / "reference.npy"), weights


@pytest.mark.slow
def test_two_workers_chief_exports_and_a_fresh_process_serves(tmp_path):
    run_workers(
        "export_worker.py",
        ["train", "--keras", "tf_keras", "--compression", "ef_topk", "--out", str(tmp_path)],
        env={"PYTHONPATH": str(ROOT)},
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(e["name"] for e in manifest) == ["model_save", "tf_saved_model"]
    # only the chief's exports exist (the other worker deleted its temporary ones)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "inputs.npy",
        "manifest.json",
        "model_save",
        "reference.npy",
        "tf_saved_model",
        "weights.npz",
    ]
    served = serve_without_tfcompress(tmp_path / "manifest.json", tmp_path / "served.npz")
    reference, weights = chief_reference(tmp_path)
    for entry in manifest:
        assert not any(t.startswith(PREFIX) for t in saved_model_op_types(entry["path"]))
        assert_serves_the_trained_model(served, entry["name"], reference, weights)
    assert_serves_the_trained_model(served, "model_save:load_model", reference, weights)


@pytest.mark.slow
def test_two_workers_keras3_chief_alone_exports(tmp_path):
    # Keras 3 needs no collective to save (tf-keras reads its metrics' variables
    # through one, so there every worker must save).
    run_workers(
        "export_worker.py",
        ["train", "--keras", "keras3", "--compression", "ef_topk", "--out", str(tmp_path)]
        + ["--savers", "chief"],
        env={"PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    served = serve_without_tfcompress(tmp_path / "manifest.json", tmp_path / "served.npz")
    reference, weights = chief_reference(tmp_path)
    for entry in manifest:
        assert_serves_the_trained_model(served, entry["name"], reference, weights)
