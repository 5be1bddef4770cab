"""DeepReduce on real gradients: bytes and encode/decode time per codec combination.

Trains a small CNN on Fashion-MNIST for a few steps (so the gradients are
those of a model that is learning, not of its initialisation), takes the
gradients of one more batch, and for each sparsity ratio (top-1% and
top-10% by default) and each (index codec, value codec) pair runs
``DeepReduce.compress`` and ``DeepReduce.decompress`` on every gradient
tensor with at least ``--min-size`` elements (the strategy's
``CompressionPolicy`` default, 1024). Reports:

* bytes on the wire relative to top-r's fp32 values + int32 indices
  (``8 r`` bytes per tensor), summed over the tensors, header included;
* the index section alone relative to ``4 r`` int32 indices;
* encode and decode time per step (all tensors, median of ``--repeats``
  calls of one ``tf.function`` each) and their sum as a share of one
  training step of the same model (forward + backward + SGD update, same
  batch size), also measured here;
* the relative L2 error ``||decoded - g|| / ||g||`` over the encoded tensors,
  next to top-r's own (Bloom P0 sends more values than top-r, so its error
  is lower; leftmost, P1, P2 and lossy value codecs add error).

Timings on a shared CPU are noisy (other processes share the cores); run
with ``--repeats`` >= 5 for stabler medians.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from tfcompress.bench.arguments import check_names, usage_error

__all__ = ["COMBINATIONS", "cnn_model", "main", "measure", "real_gradients", "train_step_seconds"]

# (label, index codec, index options, value codec, value options)
COMBINATIONS: list[tuple[str, str, dict, str, dict]] = [
    ("raw + raw", "raw", {}, "raw", {}),
    ("bitmap + raw", "bitmap", {}, "raw", {}),
    ("runlength + raw", "runlength", {}, "raw", {}),
    ("varint + raw", "varint", {}, "raw", {}),
    ("bloom P0 eps=1e-3 + raw", "bloom", {"false_positive_rate": 1e-3, "policy": "p0"}, "raw", {}),
    ("bloom P0 + raw", "bloom", {"policy": "p0"}, "raw", {}),
    ("bloom leftmost + raw", "bloom", {"policy": "leftmost"}, "raw", {}),
    ("bloom P1 random + raw", "bloom", {"policy": "random"}, "raw", {}),
    ("bloom P2 conflict sets + raw", "bloom", {"policy": "conflict_sets"}, "raw", {}),
    ("varint + fp16", "varint", {}, "fp16", {}),
    ("varint + deflate", "varint", {}, "deflate", {}),
    ("varint + qsgd 4-bit", "varint", {}, "qsgd", {}),
    ("bloom P0 + qsgd 4-bit", "bloom", {"policy": "p0"}, "qsgd", {}),
    (
        "bloom P0 eps=1e-3 + qsgd 4-bit",
        "bloom",
        {"false_positive_rate": 1e-3, "policy": "p0"},
        "qsgd",
        {},
    ),
    ("bloom P0 + polyfit", "bloom", {"policy": "p0"}, "polyfit", {}),
    ("bloom P0 + dexpfit", "bloom", {"policy": "p0"}, "dexpfit", {}),
]


def cnn_model(seed: int = 0):
    """The benchmark's CNN (Keras): 2 conv + 2 dense layers, 225k parameters."""
    import keras  # noqa: PLC0415

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _data(num_images: int):
    from tfcompress.data import load_fashion_mnist  # noqa: PLC0415

    (x, y), _ = load_fashion_mnist(subset=num_images)
    return x.astype(np.float32), y.astype(np.int64)


def _loss(model, x, y):
    logits = model(x, training=True)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def real_gradients(
    batch_size: int = 128, warmup_steps: int = 20, seed: int = 0, learning_rate: float = 0.05
) -> list[tf.Tensor]:
    """Gradients of :func:`cnn_model` on a Fashion-MNIST batch after ``warmup_steps`` of SGD.

    Returns:
      One float32 tensor per trainable variable (kernels and biases).
    """
    x, y = _data(batch_size * (warmup_steps + 1))
    model = cnn_model(seed)

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = _loss(model, xb, yb)
        return tape.gradient(loss, model.trainable_variables)

    for step in range(warmup_steps + 1):
        sl = slice(step * batch_size, (step + 1) * batch_size)
        grads = gradients(x[sl], y[sl])
        if step < warmup_steps:
            for v, g in zip(model.trainable_variables, grads, strict=True):
                v.assign_sub(learning_rate * g)
    return [tf.convert_to_tensor(g) for g in grads]


def train_step_seconds(batch_size: int = 128, repeats: int = 7, seed: int = 0) -> float:
    """Median time of one SGD training step of :func:`cnn_model` (forward, backward, update)."""
    x, y = _data(batch_size)
    model = cnn_model(seed)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = _loss(model, xb, yb)
        grads = tape.gradient(loss, model.trainable_variables)
        for v, g in zip(model.trainable_variables, grads, strict=True):
            v.assign_sub(0.01 * g)
        return loss

    return _median_seconds(lambda: step(x, y), repeats)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    gradients: list[tf.Tensor],
    ratio: float,
    combination: tuple[str, str, dict, str, dict],
    repeats: int = 5,
    min_size: int = 1024,
) -> dict:
    """Bytes, times and error of one codec combination at one top-r ratio."""
    from tfcompress.compressors import DeepReduce, Payload, TopK  # noqa: PLC0415

    label, index_name, index_options, value_name, value_options = combination
    tensors = [g for g in gradients if g.shape.num_elements() >= min_size]
    compressors = [
        DeepReduce(
            TopK(ratio=ratio),
            index_codec=index_name,
            value_codec=value_name,
            seed=1,
            index_options=index_options,
            value_options=value_options,
        )
        for _ in tensors
    ]
    topk = TopK(ratio=ratio)
    encode = tf.function(
        lambda: [c.compress(g).tensors["bytes"] for c, g in zip(compressors, tensors, strict=True)]
    )
    blobs = encode()
    decode = tf.function(
        lambda blobs: [
            c.decompress(Payload(tensors={"bytes": b}, shape=g.shape, dtype=g.dtype))
            for c, g, b in zip(compressors, tensors, blobs, strict=True)
        ]
    )
    decoded = decode(blobs)

    baseline = index_bytes = total = 0
    error = topk_error = norm = 0.0
    for g, blob, y in zip(tensors, blobs, decoded, strict=True):
        r = topk.count(g.shape.num_elements())
        baseline += 8 * r
        total += int(tf.size(blob))
        index_bytes += _index_section_bytes(blob)
        reference = topk.decompress(topk.compress(g))
        error += float(tf.reduce_sum(tf.square(y - g)))
        topk_error += float(tf.reduce_sum(tf.square(reference - g)))
        norm += float(tf.reduce_sum(tf.square(g)))
    encode_s = _median_seconds(encode, repeats)
    decode_s = _median_seconds(lambda: decode(blobs), repeats)
    return {
        "label": label,
        "ratio": ratio,
        "tensors": len(tensors),
        "bytes": total,
        "baseline_bytes": baseline,
        "relative_bytes": total / baseline,
        "index_bytes": index_bytes,
        "relative_index_bytes": index_bytes / (baseline / 2),
        "encode_ms": 1e3 * encode_s,
        "decode_ms": 1e3 * decode_s,
        # ||decoded - g|| / ||g|| over all encoded tensors, and top-r's own
        "relative_error": (error / max(norm, 1e-30)) ** 0.5,
        "topk_relative_error": (topk_error / max(norm, 1e-30)) ** 0.5,
    }


def _index_section_bytes(blob: tf.Tensor) -> int:
    # The index section length: int64 at bytes 44..52 of the header
    # (tfcompress.codecs.container).
    return int(np.frombuffer(blob.numpy()[44:52].tobytes(), "<i8")[0])


def format_table(rows: list[dict], step_ms: float) -> str:
    """Markdown table of :func:`measure` results."""
    lines = [f"Training step of the same model: {step_ms:.1f} ms (median)."]
    for ratio in sorted({row["ratio"] for row in rows}):
        first = next(row for row in rows if row["ratio"] == ratio)
        lines.append(
            f"Top-{100 * ratio:g}% alone: ||C(g) - g|| / ||g|| = "
            f"{first['topk_relative_error']:.3f} over the encoded tensors."
        )
    lines += [
        "",
        "| top-r | codecs (index + values) | bytes vs fp32+int32 | index vs int32 | "
        "encode ms | decode ms | (enc+dec) / step | error vs g |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        share = (row["encode_ms"] + row["decode_ms"]) / step_ms
        lines.append(
            f"| {100 * row['ratio']:g}% | {row['label']} | {100 * row['relative_bytes']:.1f}% | "
            f"{100 * row['relative_index_bytes']:.1f}% | {row['encode_ms']:.1f} | "
            f"{row['decode_ms']:.1f} | {100 * share:.0f}% | {row['relative_error']:.3f} |"
        )
    return "\n".join(lines)


def _plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ratios = sorted({row["ratio"] for row in rows})
    fig, axes = plt.subplots(1, len(ratios), figsize=(7 * len(ratios), 6), squeeze=False)
    for ax, ratio in zip(axes[0], ratios, strict=True):
        subset = [row for row in rows if row["ratio"] == ratio]
        labels = [row["label"] for row in subset]
        ax.barh(labels, [100 * row["relative_bytes"] for row in subset], label="total")
        ax.barh(labels, [50 * row["relative_index_bytes"] for row in subset], label="index section")
        ax.axvline(30, color="k", linestyle="--", linewidth=1, label="paper target (-70%)")
        ax.set_xlabel("bytes, % of fp32 values + int32 indices")
        ax.set_title(f"top-{100 * ratio:g}%")
        ax.invert_yaxis()
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark (``tfcompress bench deepreduce``)."""
    message = check_names(args.only, [c[0] for c in COMBINATIONS], "--only")
    if message:
        return usage_error(args, "deepreduce", message)
    out = pathlib.Path(args.out) if args.out else None
    combos = [c for c in COMBINATIONS if not args.only or c[0] in args.only]
    gradients = real_gradients(batch_size=args.batch_size)
    step_s = train_step_seconds(batch_size=args.batch_size, repeats=max(args.repeats, 3))
    rows = []
    total = len(combos) * len(args.ratios)
    done = 0
    for ratio in args.ratios:
        for combo in combos:
            done += 1
            print(
                f"[{done}/{total}] top-{100 * ratio:g}% {combo[0]} ...",
                file=sys.stderr,
                flush=True,
            )
            rows.append(measure(gradients, ratio, combo, repeats=args.repeats))
    table = format_table(rows, 1e3 * step_s)
    print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "deepreduce.md").write_text(table + "\n")
        (out / "deepreduce.json").write_text(
            json.dumps({"train_step_ms": 1e3 * step_s, "rows": rows}, indent=2) + "\n"
        )
    if args.plot:
        path = (out or pathlib.Path(".")) / "deepreduce.png"
        _plot(rows, path)
        print(f"plot: {path}", file=sys.stderr)
    return 0
