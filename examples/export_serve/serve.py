"""Serve what export.py exported, in a process where tfcompress cannot be imported.

    python examples/export_serve/serve.py /tmp/exported

Loads ``saved_model/`` with ``tf.saved_model.load`` (what TensorFlow Serving
does) and ``model.keras`` with ``keras.saving.load_model`` when present,
predicts the reference images, and compares with what the trained model
saved in ``reference.npz``: the weights must be identical bit for bit, the
predictions equal within PREDICTION_ULPS ulps of the largest logit (this
process may pick other CPU kernels than the training process, so outputs can
differ in the last bit). It also lists the op types of the exported graph and
checks that none is a tfcompress custom op. Exits with status 1 when anything
differs.
"""

import sys

# The point of this script: nothing here may need tfcompress. Make any import
# of it fail, even though it is installed in this environment.
sys.modules["tfcompress"] = None

import argparse  # noqa: E402
import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402

# The prefix of every tfcompress op name (tfcompress.ops.op_name(""), which this
# process cannot import).
CUSTOM_OP_PREFIX = "TFCompress>"
# Same weights, another process or processor: up to 3.2 ulps of the largest
# logit measured (TESTING.md); one more training step moves them by ~10^6 ulps.
PREDICTION_ULPS = 16

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("export_dir", help="the --out directory of export.py")
args = parser.parse_args()
root = pathlib.Path(args.export_dir)

try:
    import tfcompress  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("tfcompress is importable; this check would prove nothing")


def op_types(saved_model_dir: pathlib.Path) -> set[str]:
    """Op types in every graph and graph function of a SavedModel."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model_dir / "saved_model.pb").read_bytes())
    types = set()
    for meta_graph in proto.meta_graphs:
        types.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            types.update(node.op for node in function.node_def)
    return types


reference = np.load(root / "reference.npz")
images, labels, logits = reference["images"], reference["labels"], reference["logits"]
weights = [reference[f"weight{i}"] for i in range(sum(k.startswith("weight") for k in reference))]
results = []

loaded = tf.saved_model.load(str(root / "saved_model"))
signature = loaded.signatures["serving_default"]
(served,) = signature(tf.constant(images)).values()
results.append(
    (
        "saved_model (tf.saved_model.load)",
        served.numpy(),
        [v.numpy() for v in signature.variables],  # what the serving function computes with
    )
)
if (root / "model.keras").exists():
    import keras

    model = keras.saving.load_model(root / "model.keras")
    results.append(
        (
            "model.keras (keras.saving.load_model)",
            model.predict(images, verbose=0),
            model.get_weights(),
        )
    )

types = op_types(root / "saved_model")
custom = sorted(t for t in types if t.startswith(CUSTOM_OP_PREFIX))

ok = not custom
ulp = float(np.finfo(np.float32).eps) * float(np.max(np.abs(logits)))
print(f"{len(images)} reference images; {len(types)} op types in the exported graph")
print("| export | weights identical | max abs difference | in ulps | accuracy |")
print("|---|---|---|---:|---|")
for name, predictions, served_weights in results:
    same_weights = len(served_weights) == len(weights) and all(
        np.array_equal(a, b) for a, b in zip(served_weights, weights, strict=True)
    )
    difference = float(np.max(np.abs(predictions - logits)))
    accuracy = float(np.mean(np.argmax(predictions, axis=1) == labels))
    ok = ok and same_weights and difference <= PREDICTION_ULPS * ulp
    print(
        f"| {name} | {same_weights} | {difference:.3g} | {difference / ulp:.1f} | {accuracy:.4f} |"
    )
print(f"tfcompress custom ops in the exported graph: {custom or 'none'}")
print(
    f"OK: served without tfcompress, same weights, predictions within {PREDICTION_ULPS} ulps"
    if ok
    else "MISMATCH"
)
sys.exit(0 if ok else 1)
