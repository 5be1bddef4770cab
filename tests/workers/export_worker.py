"""Export a model trained with compression, and serve exports without tfcompress.

Two commands:

``export_worker.py train --keras {tf_keras,keras3} --compression NAME --out DIR [--savers all|chief]``
    One worker of a multi-worker ``model.fit`` with ``CompressionMonitor``
    (so the model tracks the compressor state), started by the tests' harness.
    With ``--savers all`` every worker saves (the chief into DIR, the others
    into a temporary directory they delete, as TensorFlow's multi-worker saving
    guide does); with ``--savers chief`` only the chief does. The chief also
    writes DIR/manifest.json and, next to it, the inputs, the reference
    predictions and the trained weights (``weights.npz``: ``weight0``, ...).

``export_worker.py serve MANIFEST OUTPUT``
    A fresh process in which ``import tfcompress`` fails: loads every export
    listed in MANIFEST, predicts on its inputs, and writes the predictions to
    OUTPUT (an .npz keyed by export name), with the weights each loaded
    model computes with (keys ``NAME:weight0``, ``NAME:weight1``, ...).

Manifest: a JSON list of ``{"name", "kind", "path", "inputs"}`` with kind one of
``saved_model`` (``tf.saved_model.load``, signature ``serving_default``),
``tf_keras_saved_model`` (the same, and also ``tf_keras.models.load_model``)
and ``keras_file`` (``keras.saving.load_model`` of a ``.keras`` file).
"""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "serve":
    # Before anything else: this process must not be able to import tfcompress.
    sys.modules["tfcompress"] = None

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402


def serve(manifest_path: str, output: str) -> None:
    try:
        import tfcompress  # noqa: F401, PLC0415
    except ImportError:
        pass
    else:
        raise AssertionError("tfcompress is importable in the serving process")
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    with open(manifest_path) as f:
        manifest = json.load(f)
    predictions = {}

    def served(name, prediction, weights):
        predictions[name] = prediction
        for i, w in enumerate(weights):
            predictions[f"{name}:weight{i}"] = w

    for entry in manifest:
        inputs = np.load(entry["inputs"])
        if entry["kind"] in ("saved_model", "tf_keras_saved_model"):
            loaded = tf.saved_model.load(entry["path"])
            signature = loaded.signatures["serving_default"]
            (prediction,) = signature(tf.constant(inputs)).values()
            # The variables the serving function computes with, in capture order.
            served(entry["name"], prediction.numpy(), [v.numpy() for v in signature.variables])
            if entry["kind"] == "tf_keras_saved_model":
                import tf_keras  # noqa: PLC0415

                model = tf_keras.models.load_model(entry["path"])
                served(
                    entry["name"] + ":load_model",
                    model.predict(inputs, verbose=0),
                    model.get_weights(),
                )
        elif entry["kind"] == "keras_file":
            import keras  # noqa: PLC0415

            model = keras.saving.load_model(entry["path"])
            served(entry["name"], model.predict(inputs, verbose=0), model.get_weights())
        else:
            raise ValueError(f"unknown export kind {entry['kind']!r} of {entry['name']!r}")
    np.savez(output, **predictions)
    print("served", sorted(predictions), "without tfcompress", file=sys.stderr)


def train(args) -> None:
    if args.keras == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if args.keras == "tf_keras":
        import tf_keras as keras  # noqa: PLC0415
    else:
        import keras  # noqa: PLC0415

    import tfcompress  # noqa: PLC0415
    from tests.keras_models import small_conv_net  # noqa: PLC0415
    from tfcompress.keras.callbacks import CompressionMonitor  # noqa: PLC0415

    compression = {
        "ef_topk": tfcompress.compressors.ErrorFeedback(tfcompress.compressors.TopK(ratio=0.05)),
        "diana_qsgd": tfcompress.compressors.DIANA(tfcompress.compressors.QSGD(bits=4)),
        "qsgd": tfcompress.compressors.QSGD(bits=4),
        "fp16": tfcompress.compressors.FP16(),
    }[args.compression]
    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=compression, policy=256
    )
    chief = strategy.extended.should_checkpoint
    keras.utils.set_random_seed(1)

    batch = 16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 4, 12, 12, 1)).astype("float32")
    y = rng.integers(0, 4, size=(batch * 4,)).astype("int32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)
    with strategy.scope():
        model = small_conv_net(keras, 12)
    model.fit(dataset, epochs=2, verbose=0, callbacks=[CompressionMonitor()])
    stats = tfcompress.distribute.traffic_stats(strategy)
    assert stats["bytes_compressible"] > 0, stats

    if not chief and args.savers == "chief":
        return
    out = args.out if chief else tempfile.mkdtemp(prefix="export_worker_")
    inputs = x[:16]
    serve_fn = tf.function(lambda v: model(v, training=False))
    reference = serve_fn(tf.constant(inputs)).numpy()
    manifest = []
    if args.keras == "tf_keras":
        model.save(os.path.join(out, "model_save"))
        manifest.append({"name": "model_save", "kind": "tf_keras_saved_model"})
    else:
        model.export(os.path.join(out, "model_export"))
        manifest.append({"name": "model_export", "kind": "saved_model"})
        model.save(os.path.join(out, "model.keras"))
        manifest.append({"name": "model.keras", "kind": "keras_file"})
    tf.saved_model.save(model, os.path.join(out, "tf_saved_model"))
    manifest.append({"name": "tf_saved_model", "kind": "saved_model"})
    if not chief:
        shutil.rmtree(out)
        return
    np.save(os.path.join(out, "inputs.npy"), inputs)
    np.save(os.path.join(out, "reference.npy"), reference)
    np.savez(
        os.path.join(out, "weights.npz"),
        **{f"weight{i}": w for i, w in enumerate(model.get_weights())},
    )
    for entry in manifest:
        entry["path"] = os.path.join(out, entry["name"])
        entry["inputs"] = os.path.join(out, "inputs.npy")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve")
    serve_parser.add_argument("manifest")
    serve_parser.add_argument("output")
    train_parser = commands.add_parser("train")
    train_parser.add_argument("--keras", choices=["tf_keras", "keras3"], required=True)
    train_parser.add_argument("--compression", default="ef_topk")
    train_parser.add_argument("--out", required=True)
    train_parser.add_argument(
        "--savers", choices=["all", "chief"], default="all", help="which workers save"
    )
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.manifest, args.output)
    else:
        train(args)


if __name__ == "__main__":
    main()
