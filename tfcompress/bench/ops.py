"""Compressor throughput: C++ kernels vs pure-TF references vs a memory copy.

For each compressor and tensor size, times ``decompress(compress(x))`` of a
float32 tensor inside one ``tf.function`` (median of ``--repeats`` calls after
a warm-up call), once with the C++ kernels and once with the pure-TF
references, and reports GB/s of float32 input, the kernel's speed-up over the
reference, its share of a plain memory copy's bandwidth (NumPy ``copyto`` of
the same bytes, measured in the same run) and the compression ratio (input
bytes / payload bytes). With the kernels, ``compress`` and ``decompress`` are
also timed apart (each its own ``tf.function``): encode and decode GB/s of the
dense tensor.

The decode-and-sum rows (``--sum-payloads``; QSGD 4-bit, and TopK 1% when
``topk 1%`` is among the rows) time what a worker does with the ``N``
payloads it receives: the compressor's ``aggregate``, one pass over the
``N`` payloads into one output (``qsgd_decode_sum``; TopK's
``sparse_scatter_sum``), against the default ``Compressor.aggregate`` (``N``
decodes, stacked and summed), each against a memory copy of the output's
bytes.

The ``ef(topk 1%)`` row is error feedback around TopK 1%: on the CPU its
compress is one ``top_k_feedback`` pass (memory update, selection, new
residual) where the reference adds, selects and subtracts apart.

Thread scaling (``--threads``, default 1 and 2): every kernel row's round
trip and every one-pass decode-and-sum is timed again in one child process
per thread count, with TensorFlow's intra-op pool (which the kernels split
their work over) set to that many threads before the child's first op
(TensorFlow fixes its pools when it starts); the table gains a GB/s column
per count (ms for decode-and-sum) and the last count's speed-up over the
first. ``--threads`` with no count leaves the columns out.

The DeepReduce rows (``deepreduce <index codec>``) sparsify to the top 1% and
encode the indices with each index codec (raw float32 values; ``bloom`` is
policy P0 at the default ``eps = 0.1 r / d``), so their encode and decode sit
next to ``topk 1%``'s own: the index codec's cost is the difference.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import tfcompress
from tfcompress import compressors as C
from tfcompress import ops
from tfcompress.bench.arguments import check_names, usage_error

__all__ = ["CASES", "main", "measure"]


def _compressor_cases() -> dict[str, Callable[[], C.Compressor]]:
    cases: dict[str, Callable[[], C.Compressor]] = {
        "identity": C.Identity,
        "fp16": C.FP16,
    }
    optional = {
        "qsgd 4-bit": ("qsgd", {"bits": 4, "seed": 1}),
        "terngrad": ("terngrad", {"seed": 1}),
        "signsgd": ("signsgd", {}),
        "topk 1%": ("topk", {"ratio": 0.01}),
        "threshold": ("threshold", {"value": 2.5}),
        "randomk 1%": ("randomk", {"ratio": 0.01, "seed": 1}),
    }
    for index_codec in ("raw", "bitmap", "runlength", "varint", "bloom"):
        optional[f"deepreduce {index_codec}"] = (
            "deepreduce",
            {"sparsifier": "topk", "index_codec": index_codec, "value_codec": "raw"},
        )
    optional["deepreduce bloom + qsgd"] = (
        "deepreduce",
        {"sparsifier": "topk", "index_codec": "bloom", "value_codec": "qsgd"},
    )
    for label, (name, options) in optional.items():
        if name in C.available():
            cases[label] = lambda name=name, options=options: C.get(name, **options)
    if {"topk", "error_feedback"} <= set(C.available()):
        cases["ef(topk 1%)"] = lambda: C.ErrorFeedback(C.TopK(ratio=0.01))
    return cases


CASES = _compressor_cases


def _round_trip_fn(label: str):
    if label == "pack_signs":
        return lambda x: ops.unpack_signs(ops.pack_signs(x), tf.size(x, out_type=tf.int64)), None
    if label == "pack_bits 4-bit":

        def fn(x):
            values = tf.cast(tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32), 15), tf.int32)
            return ops.unpack_bits(ops.pack_bits(values, 4), tf.size(x, out_type=tf.int64), 4)

        return fn, None
    compressor = _compressor_cases()[label]()

    def fn(x):
        return compressor.decompress(compressor.compress(x))

    return fn, compressor


def _payload_ratio(label: str, x: tf.Tensor) -> float:
    if label == "pack_signs":
        return 32.0
    if label == "pack_bits 4-bit":
        return 8.0
    compressor = _compressor_cases()[label]()
    payload = compressor.compress(x)
    return x.shape.num_elements() * 4 / max(int(C.payload_nbytes(payload)), 1)


def _encode_decode_seconds(label: str, x: tf.Tensor, repeats: int) -> tuple[float, float]:
    """Median seconds of ``compress(x)`` and of ``decompress(payload)``, each its own function."""
    compressor = _compressor_cases()[label]()
    encode = tf.function(lambda x: compressor.compress(x).tensors)
    tensors = encode(x)
    structure = compressor.compress(x)  # the payload's metadata (shape, dtype)
    decode = tf.function(lambda tensors: compressor.decompress(structure.replace(tensors)))
    encode_s = measure(lambda: tf.nest.flatten(encode(x))[0].numpy(), repeats)
    decode_s = measure(lambda: decode(tensors).numpy(), repeats)
    return encode_s, decode_s


def measure(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _memcpy_seconds(n: int, repeats: int) -> float:
    src = np.random.default_rng(0).normal(size=n).astype(np.float32)
    dst = np.empty_like(src)
    return measure(lambda: np.copyto(dst, src), repeats)


def main(args: argparse.Namespace) -> int:
    labels = ["pack_signs", "pack_bits 4-bit", *list(_compressor_cases())]
    if args.only:
        message = check_names(args.only, labels, "--only")
        if message:
            return usage_error(args, "ops", message)
        labels = [label for label in labels if label in args.only]
    kernel = ops.kernel_available()
    impls = ["kernel", "reference"] if kernel else ["reference"]
    if kernel and getattr(args, "kernels_only", False):
        impls = ["kernel"]
    total = len(args.sizes) * len(labels) * len(impls)
    rows = []
    done = 0
    for n in args.sizes:
        x = tf.constant(np.random.default_rng(1).normal(size=n).astype(np.float32))
        copy_s = _memcpy_seconds(n, args.repeats)
        rows.append(
            {
                "label": "memory copy",
                "size": n,
                "impl": "numpy",
                "gbps": 4 * n / copy_s / 1e9,
                "seconds": copy_s,
                "ratio": 1.0,
            }
        )
        for label in labels:
            ratio = _payload_ratio(label, x)
            for impl in impls:
                done += 1
                print(
                    f"\r[{done}/{total}] {label} n={n:,} {impl} ...".ljust(60),
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                with ops.implementation(impl):
                    seconds = _round_trip_seconds(label, x, args.repeats)
                    row = {
                        "label": label,
                        "size": n,
                        "impl": impl,
                        "gbps": 4 * n / seconds / 1e9,
                        "seconds": seconds,
                        "ratio": ratio,
                        "memcpy_gbps": 4 * n / copy_s / 1e9,
                    }
                    if impl == "kernel" and label in _compressor_cases():
                        encode_s, decode_s = _encode_decode_seconds(label, x, args.repeats)
                        row["encode_gbps"] = 4 * n / encode_s / 1e9
                        row["decode_gbps"] = 4 * n / decode_s / 1e9
                rows.append(row)
    sum_rows = []
    counts = getattr(args, "sum_payloads", None) or []
    sum_labels = _sum_labels(labels) if counts and kernel else []
    if not sum_labels:
        counts = []
    for n in args.sizes if counts else []:
        for sum_label in sum_labels:
            print(f"\r[{sum_label}] n={n:,} ...".ljust(60), end="", file=sys.stderr, flush=True)
            sum_rows += _decode_sum_rows(n, counts, args.repeats, sum_label)
    thread_counts = list(getattr(args, "threads", None) or []) if kernel else []
    if thread_counts:
        scaling = {}
        for threads in thread_counts:
            print(
                f"\r[threads] {threads} intra-op thread(s) ...".ljust(60),
                end="",
                file=sys.stderr,
                flush=True,
            )
            scaling[threads] = _thread_child_seconds(
                threads, args.sizes, labels, counts, args.repeats
            )
        _add_thread_columns(rows, sum_rows, scaling)
    print(file=sys.stderr)
    table = format_table(rows)
    if sum_rows:
        table += "\n\n" + format_sum_table(sum_rows)
    print(table)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ops.json").write_text(json.dumps(rows + sum_rows, indent=2))
        (out / "ops.md").write_text(table + "\n")
        if args.plot:
            _plot(rows, out / "ops.png")
        print(f"\nwritten: {out}/ops.md" + (f", {out}/ops.png" if args.plot else ""))
    return 0


def _round_trip_seconds(label: str, x: tf.Tensor, repeats: int) -> float:
    """Median seconds of ``label``'s round trip of ``x`` in one ``tf.function``, traced here."""
    fn, _ = _round_trip_fn(label)
    graph = tf.function(fn)
    graph.get_concrete_function(x)  # trace inside the caller's implementation
    return measure(lambda: graph(x).numpy(), repeats)


SUM_LABEL = "qsgd 4-bit decode-and-sum"
#: Decode-and-sum rows: their label -> the round-trip row whose compressor they sum.
SUM_CASES = {SUM_LABEL: "qsgd 4-bit", "topk 1% decode-and-sum": "topk 1%"}


def _sum_labels(labels: list[str]) -> list[str]:
    """The decode-and-sum rows of the round-trip rows ``labels``."""
    return [sum_label for sum_label, label in SUM_CASES.items() if label in labels]


def _sum_payloads(n: int, count: int, sum_label: str = SUM_LABEL) -> tuple[C.Compressor, list]:
    compressor = _compressor_cases()[SUM_CASES[sum_label]]()
    rng = np.random.default_rng(2)
    payloads = [
        compressor.compress(tf.constant(rng.normal(size=n).astype(np.float32)))
        for _ in range(count)
    ]
    return compressor, payloads


def _aggregate_seconds(aggregate: Callable, received: list, repeats: int) -> float:
    graph = tf.function(lambda: aggregate(received))
    return measure(lambda: graph().numpy(), repeats)


def _decode_sum_rows(
    n: int, counts: list[int], repeats: int, sum_label: str = SUM_LABEL
) -> list[dict]:
    """Seconds of a compressor's one-pass aggregate and of the default one, N payloads of n."""
    compressor, payloads = _sum_payloads(n, max(counts), sum_label)
    copy_s = _memcpy_seconds(n, repeats)
    rows = []
    for count in counts:
        received = payloads[:count]
        with ops.implementation("kernel"):
            fused_s = _aggregate_seconds(compressor.aggregate, received, repeats)
            separate_s = _aggregate_seconds(
                functools.partial(C.Compressor.aggregate, compressor), received, repeats
            )
        rows.append(
            {
                "label": sum_label,
                "size": n,
                "payloads": count,
                "fused_seconds": fused_s,
                "separate_seconds": separate_s,
                "memcpy_seconds": copy_s,
            }
        )
    return rows


def _thread_child_seconds(
    threads: int, sizes: list[int], labels: list[str], sum_counts: list[int], repeats: int
) -> list[dict]:
    """Kernel round trips (and one-pass decode-and-sums) timed in a child with ``threads`` threads.

    TensorFlow sizes its intra-op pool once, when it starts, so each thread
    count needs its own process: ``python -m tfcompress.bench.ops
    --thread-child N ...`` (:func:`_thread_child`). Returns its results:
    ``{"label", "size", "seconds"}`` and, for decode-and-sum,
    ``{"label", "size", "payloads", "seconds"}``.
    """
    package_root = pathlib.Path(tfcompress.__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="tfcompress-threads-") as scratch:
        path = pathlib.Path(scratch) / "results.json"
        command = [
            sys.executable,
            "-m",
            "tfcompress.bench.ops",
            "--thread-child",
            str(threads),
            "--json",
            str(path),
            "--repeats",
            str(repeats),
            "--sizes",
            *(str(n) for n in sizes),
            "--labels",
            *labels,
            "--sum-payloads",
            *(str(c) for c in sum_counts),
        ]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"bench ops: the {threads}-thread child failed (exit {proc.returncode}):\n"
                + proc.stderr[-4000:]
            )
        result = json.loads(path.read_text())
    if result["threads"] != threads:
        raise RuntimeError(
            f"bench ops: the child ran with {result['threads']} intra-op threads, not {threads}"
        )
    return result["results"]


def _add_thread_columns(rows: list[dict], sum_rows: list[dict], scaling: dict) -> None:
    """Adds ``threads_gbps`` (kernel rows) and ``threads_seconds`` (decode-and-sum rows)."""
    for threads, results in scaling.items():
        for result in results:
            if result["label"] in SUM_CASES:
                for row in sum_rows:
                    if (row["label"], row["size"], row["payloads"]) == (
                        result["label"],
                        result["size"],
                        result["payloads"],
                    ):
                        row.setdefault("threads_seconds", {})[str(threads)] = result["seconds"]
                continue
            for row in rows:
                if row["impl"] == "kernel" and (row["label"], row["size"]) == (
                    result["label"],
                    result["size"],
                ):
                    gbps = 4 * row["size"] / result["seconds"] / 1e9
                    row.setdefault("threads_gbps", {})[str(threads)] = gbps


def _thread_child(argv: list[str]) -> int:
    """The child of :func:`_thread_child_seconds`: sets the pool, then times the kernels."""
    parser = argparse.ArgumentParser(prog="python -m tfcompress.bench.ops")
    parser.add_argument("--thread-child", type=int, required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--labels", nargs="*", default=[])
    parser.add_argument("--sum-payloads", type=int, nargs="*", default=[])
    args = parser.parse_args(argv)
    # Before the first op: TensorFlow creates its pools then, and keeps them.
    tf.config.threading.set_intra_op_parallelism_threads(args.thread_child)
    results = []
    for n in args.sizes:
        x = tf.constant(np.random.default_rng(1).normal(size=n).astype(np.float32))
        with ops.implementation("kernel"):
            for label in args.labels:
                seconds = _round_trip_seconds(label, x, args.repeats)
                results.append({"label": label, "size": n, "seconds": seconds})
            for sum_label in _sum_labels(args.labels) if args.sum_payloads else []:
                compressor, payloads = _sum_payloads(n, max(args.sum_payloads), sum_label)
                for count in args.sum_payloads:
                    seconds = _aggregate_seconds(
                        compressor.aggregate, payloads[:count], args.repeats
                    )
                    results.append(
                        {"label": sum_label, "size": n, "payloads": count, "seconds": seconds}
                    )
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    pathlib.Path(args.json).write_text(json.dumps({"threads": threads, "results": results}))
    return 0


def _thread_counts(rows: list[dict], key: str) -> list[str]:
    counts = {t for r in rows for t in r.get(key, {})}
    return sorted(counts, key=int)


def _thread_cells(values: dict, counts: list[str], form) -> str:
    """The thread columns of one line: a cell per count, then the last count over the first."""
    cells = "".join(f" {form(values[t])} |" if t in values else " |" for t in counts)
    if len(counts) > 1:
        first, last = values.get(counts[0]), values.get(counts[-1])
        cells += f" {last / first:.2f}x |" if first and last else " |"
    return cells


def format_sum_table(rows: list[dict]) -> str:
    """Markdown table of the decode-and-sum rows."""
    counts = _thread_counts(rows, "threads_seconds")
    header = "".join(f" one pass, {t} thr (ms) |" for t in counts)
    header += f" {counts[-1]} thr / {counts[0]} thr |" if len(counts) > 1 else ""
    lines = [
        "| decode-and-sum | elements | payloads | one pass (ms) | N decodes + sum (ms) "
        "| speed-up | one pass / memcpy of the output |" + header,
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(counts) + (len(counts) > 1)),
    ]
    for r in rows:
        # Speed-up of the last count over the first: time ratio first / last.
        speeds = {t: 1.0 / s for t, s in r.get("threads_seconds", {}).items()}
        cells = _thread_cells(speeds, counts, lambda speed: f"{1e3 / speed:.1f}")
        lines.append(
            f"| {r['label']} | {r['size']:,} | {r['payloads']} | {1e3 * r['fused_seconds']:.1f} "
            f"| {1e3 * r['separate_seconds']:.1f} "
            f"| {r['separate_seconds'] / r['fused_seconds']:.2f}x "
            f"| {r['fused_seconds'] / r['memcpy_seconds']:.1f}x |" + cells
        )
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    """Markdown table: one line per (compressor, size) with kernel and reference side by side."""
    counts = _thread_counts(rows, "threads_gbps")
    header = "".join(f" {t} thr GB/s |" for t in counts)
    header += f" {counts[-1]} thr / {counts[0]} thr |" if len(counts) > 1 else ""
    blank = " |" * (len(counts) + (len(counts) > 1))
    lines = [
        "| compressor | elements | kernel GB/s | encode GB/s | decode GB/s | reference GB/s "
        "| kernel / reference | kernel / memcpy | ratio |" + header,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        + "---:|" * (len(counts) + (len(counts) > 1)),
    ]
    by_key: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows:
        by_key.setdefault((r["label"], r["size"]), {})[r["impl"]] = r
    for (label, size), impls in by_key.items():
        if "numpy" in impls:
            lines.append(
                f"| memory copy (NumPy) | {size:,} | {impls['numpy']['gbps']:.2f} | | | | | | 1.00x |"
                + blank
            )
            continue
        k, ref = impls.get("kernel"), impls.get("reference")
        kernel_cell = f"{k['gbps']:.2f}" if k else "n/a"
        speedup = f"{k['gbps'] / ref['gbps']:.1f}x" if k and ref else ""
        reference_cell = f"{ref['gbps']:.2f}" if ref else "not run"
        ratio = (ref or k)["ratio"]
        share = f"{k['gbps'] / k['memcpy_gbps']:.2f}" if k else ""
        encode = f"{k['encode_gbps']:.2f}" if k and "encode_gbps" in k else ""
        decode = f"{k['decode_gbps']:.2f}" if k and "decode_gbps" in k else ""
        threads = _thread_cells(
            (k or {}).get("threads_gbps", {}), counts, lambda gbps: f"{gbps:.2f}"
        )
        lines.append(
            f"| {label} | {size:,} | {kernel_cell} | {encode} | {decode} | {reference_cell} "
            f"| {speedup} | {share} | {ratio:.1f}x |" + threads
        )
    return "\n".join(lines)


def _plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sizes = sorted({r["size"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 5), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        sel = [r for r in rows if r["size"] == n and r["impl"] != "numpy"]
        labels = list(dict.fromkeys(r["label"] for r in sel))
        pos = np.arange(len(labels))
        for offset, impl in ((-0.2, "kernel"), (0.2, "reference")):
            vals = [
                next((r["gbps"] for r in sel if r["label"] == lb and r["impl"] == impl), 0)
                for lb in labels
            ]
            ax.bar(pos + offset, vals, width=0.4, label=impl)
        copy = next(r["gbps"] for r in rows if r["size"] == n and r["impl"] == "numpy")
        ax.axhline(copy, color="k", linestyle="--", label="memory copy")
        ax.set_xticks(pos, labels, rotation=45, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("GB/s of float32 input")
        ax.set_title(f"{n:,} elements, tfcompress {tfcompress.__version__}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(_thread_child(sys.argv[1:]))
