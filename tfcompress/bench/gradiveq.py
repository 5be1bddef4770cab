"""GradiVeQ on real gradients: compression ratio per layer, cost per step, overlap.

``tfcompress bench gradiveq`` trains a ResNet-20-style CNN (He et al. 2016; 3
stages x 3 basic blocks, 16/32/64 channels, on 28x28x1 inputs) on
Fashion-MNIST with plain SGD and drives GradiVeQ's phases on its real
gradients, one worker (N = 1):

1. ``--train-steps`` exact steps (the warm-up), then ``--sampling-steps``
   sampling steps whose gradients are recorded, then the bases are fitted and
   ``--compressed-steps`` steps train on the reconstructed gradients
   ``U_d U_d^T (g - mu) + mu``.
2. Per compressed tensor (the policy's: float tensors of >= 1,024 elements;
   biases, batch-norm parameters and the small first conv travel exactly):
   ``K``, ``S``, ``d``, kept energy, the ratio ``4 n / payload bytes``, and the
   relative reconstruction error ``||g_hat - g|| / ||g||`` averaged over the
   compressed steps. The overall ratio counts the compressed tensors, and
   then every gradient of the model (exact ones at full size).
3. ``compress`` and ``decompress`` of all compressed tensors in one
   ``tf.function`` each (median of ``--repeats`` calls).
4. Overlap: one compressed aggregation of the same gradients through the
   compressing cross-device ops of a 2-replica in-process MirroredStrategy
   (two logical CPUs, TensorFlow's collective all-reduce), with each tensor's
   coefficients in 1 pack and in ``--packs`` packs; each pack is its own
   all-reduce, so TensorFlow can project pack ``p + 1`` while pack ``p`` is
   reduced. Compared with the exact all-reduce of the same tensors.

Timings are wall-clock medians on a shared machine: noisy.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

from tfcompress.bench.arguments import usage_error

__all__ = ["main", "resnet20"]

_DEVICES = ["/cpu:0", "/cpu:1"]


def _configure_devices(tf) -> None:
    """Two logical CPUs and enough inter-op threads for two blocking collectives."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
        tf.config.threading.set_inter_op_parallelism_threads(8)
    except RuntimeError:  # already initialised (e.g. called twice in one process)
        pass


def resnet20(keras, input_shape=(28, 28, 1), classes: int = 10):
    """ResNet-20 (3 stages x 3 basic blocks, 16/32/64 channels) for small images."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = keras.layers.Conv2D(channels, 3, stride, padding="same", use_bias=False)(x)
            y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
            y = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization()(y)
            if stride != 1:
                shortcut = keras.layers.Conv2D(channels, 1, stride, use_bias=False)(x)
                shortcut = keras.layers.BatchNormalization()(shortcut)
            x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def _median_ms(fn, repeats: int) -> float:
    fn()  # trace / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark; prints the table and writes gradiveq.{md,json,png} to ``--out``."""
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow only when running

    _configure_devices(tf)
    import tfcompress  # noqa: PLC0415
    from tfcompress.compressors import GradiVeQ, TensorContext, payload_nbytes  # noqa: PLC0415

    keras = tf.keras
    tf.random.set_seed(0)
    total_steps = args.train_steps + args.sampling_steps + args.compressed_steps
    model = resnet20(keras)
    optimizer = keras.optimizers.SGD(args.learning_rate, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables
    options = {
        "warmup_steps": args.train_steps,
        "sampling_steps": args.sampling_steps,
        "compressed_steps": args.compressed_steps,
        "energy_loss": args.energy_loss,
        "slice_length": args.slice_length,
        "sampling": args.sampling,
        "error_feedback": args.error_feedback,
    }
    if args.max_components is not None:
        options["max_components"] = args.max_components
    chosen = [i for i, v in enumerate(variables) if v.shape.num_elements() >= 1024]
    try:
        compressor = GradiVeQ(**options)
        schedule = compressor.schedule(0, 1, None)
        layers = {
            i: compressor.bind(
                TensorContext(
                    key=f"{variables[i].name}", shape=variables[i].shape, dtype=variables[i].dtype
                )
            )
            for i in chosen
        }
    except ValueError as error:
        # The options were checked one by one; what is left is the slice length that
        # does not fit a layer of the model, found before any data is read.
        option = "" if args.slice_length is None else f"--slice-length {args.slice_length}: "
        return usage_error(args, "gradiveq", f"{option}{error}")
    (x, y), _ = tfcompress.data.load_fashion_mnist(subset=args.batch_size * total_steps)

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return loss, tape.gradient(loss, variables)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, variables, strict=True))

    errors: dict[int, list[float]] = {i: [] for i in chosen}
    payload_bytes: dict[int, int] = {}
    sampled: list[list[tf.Tensor]] = []
    started = time.perf_counter()
    for step in range(total_steps):
        rows = slice(step * args.batch_size, (step + 1) * args.batch_size)
        loss, grads = gradients(tf.constant(x[rows]), tf.constant(y[rows]))
        branch = int(schedule.branch_index())
        grads = list(grads)
        if branch == 0 and int(schedule.step) >= args.train_steps:
            sampled.append([grads[i] for i in chosen])
        for i in chosen:
            view = layers[i].branch(branch)
            payload = view.compress(grads[i])
            if view.summable:
                decoded = view.decompress(payload)
            else:
                decoded = view.aggregate([payload])
            if branch == 1:
                exact = grads[i]
                errors[i].append(float(tf.norm(decoded - exact) / tf.norm(exact)))
                payload_bytes[i] = int(payload_nbytes(payload))
            grads[i] = decoded
        schedule.advance(tf.constant(branch))
        apply(grads)
        phase = "compressed" if branch else ("sampling" if step >= args.train_steps else "warm-up")
        print(
            f"\rstep {step + 1}/{total_steps} ({phase}) loss {float(loss):.3f} "
            f"{time.perf_counter() - started:.0f}s",
            end="",
            file=sys.stderr,
            flush=True,
        )
    print(file=sys.stderr)

    rows = []
    for i in chosen:
        layer = layers[i]
        n = variables[i].shape.num_elements()
        k, s = layer.geometry
        rows.append(
            {
                "tensor": getattr(variables[i], "path", variables[i].name),
                "shape": variables[i].shape.as_list(),
                "K": k,
                "S": s,
                "d": int(layer.components),
                "kept_energy": float(layer.kept_energy),
                "heldout_error": float(layer.heldout_error),
                "bytes": 4 * n,
                "payload_bytes": payload_bytes[i],
                "ratio": 4 * n / payload_bytes[i],
                "relative_error": float(np.mean(errors[i])),
            }
        )
    all_bytes = sum(4 * v.shape.num_elements() for v in variables)
    compressed_bytes = sum(r["bytes"] for r in rows)
    sent = sum(r["payload_bytes"] for r in rows)
    summary = {
        "ratio_compressed_tensors": compressed_bytes / sent,
        "ratio_all_gradients": all_bytes / (sent + all_bytes - compressed_bytes),
        "mean_relative_error": float(np.mean([r["relative_error"] for r in rows])),
    }

    last = list(sampled[-1])
    views = [layers[i].branch(1) for i in chosen]
    compress_all = tf.function(
        lambda gs: [v.compress(g).tensors for v, g in zip(views, gs, strict=True)]
    )
    payloads = [v.compress(g) for v, g in zip(views, last, strict=True)]
    decompress_all = tf.function(
        lambda ts: [v.decompress(p.replace(t)) for v, p, t in zip(views, payloads, ts, strict=True)]
    )
    tensors = [p.tensors for p in payloads]
    summary["compress_ms"] = _median_ms(lambda: compress_all(last), args.repeats)
    summary["decompress_ms"] = _median_ms(lambda: decompress_all(tensors), args.repeats)
    summary["overlap"] = _overlap(tf, tfcompress, GradiVeQ, options, sampled, args)

    table = _format(rows, summary, args)
    print(table)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gradiveq.md").write_text(table + "\n")
        (out / "gradiveq.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
        if args.plot:
            _plot(rows, out / "gradiveq.png")
    return 0


def _overlap(tf, tfcompress, gradiveq_cls, options, sampled, args) -> dict[str, float]:
    """ms per aggregation through a 2-replica MirroredStrategy: exact, 1 pack, N packs."""
    results = {}
    values = [tf.Variable(g, trainable=False) for g in sampled[0]]
    for label, packs in (("exact", None), ("1 pack", 1), (f"{args.packs} packs", args.packs)):
        compression = None
        if packs is not None:
            compression = gradiveq_cls(
                **{
                    **options,
                    "warmup_steps": 0,
                    "compressed_steps": 10**9,
                    "packs": packs,
                },
            )
        strategy = tfcompress.distribute.MirroredStrategy(
            _DEVICES, compression=compression, policy=1024
        )

        @tf.function
        def aggregate(strategy=strategy):
            def step():
                context = tf.distribute.get_replica_context()
                return context.all_reduce("sum", [v.read_value() for v in values])

            return strategy.run(step)

        if packs is not None:
            for sample in sampled:  # the sampling block, then compressed from here on
                for v, g in zip(values, sample, strict=True):
                    v.assign(g)
                aggregate()
        results[label] = _median_ms(aggregate, args.repeats)
    return results


def _format(rows, summary, args) -> str:
    lines = [
        f"GradiVeQ on ResNet-20 / Fashion-MNIST: {args.train_steps} warm-up steps, "
        f"{args.sampling_steps} sampling, {args.compressed_steps} compressed; "
        f"energy_loss {args.energy_loss}, batch {args.batch_size}",
        "",
        "| tensor | shape | K | S | d | kept energy | ratio | rel. error |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tensor']} | {'x'.join(map(str, r['shape']))} | {r['K']} | {r['S']} | "
            f"{r['d']} | {r['kept_energy']:.3f} | {r['ratio']:.1f}x | {r['relative_error']:.3f} |"
        )
    s = summary
    lines += [
        "",
        f"overall ratio: {s['ratio_compressed_tensors']:.2f}x on the compressed tensors, "
        f"{s['ratio_all_gradients']:.2f}x on all gradients; mean relative error "
        f"{s['mean_relative_error']:.3f}",
        f"compress {s['compress_ms']:.2f} ms, decompress {s['decompress_ms']:.2f} ms per step "
        f"(all compressed tensors, median of {args.repeats})",
        "aggregation through a 2-replica MirroredStrategy (ms, median): "
        + ", ".join(f"{k} {v:.2f}" for k, v in s["overlap"].items()),
    ]
    return "\n".join(lines)


def _plot(rows, path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [str(i) for i in range(len(rows))]
    axes[0].bar(labels, [r["ratio"] for r in rows])
    axes[0].set_ylabel("compression ratio (x)")
    axes[0].set_xlabel("compressed tensor (model order)")
    axes[1].bar(labels, [r["relative_error"] for r in rows], color="tab:orange")
    axes[1].set_ylabel("relative reconstruction error")
    axes[1].set_xlabel("compressed tensor (model order)")
    fig.suptitle("GradiVeQ on ResNet-20 / Fashion-MNIST")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
