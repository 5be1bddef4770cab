"""``tfcompress bench ops``' thread-scaling columns: one child process per intra-op thread count."""

import json

from tests.bench.test_bench import run_cli
from tfcompress.bench import ops as bench_ops


def _kernel_row(label, size, gbps, threads=None):
    row = {
        "label": label,
        "size": size,
        "impl": "kernel",
        "gbps": gbps,
        "seconds": 4 * size / gbps / 1e9,
        "ratio": 6.3,
        "memcpy_gbps": 8.0,
    }
    if threads is not None:
        row["threads_gbps"] = threads
    return row


def test_table_has_a_column_per_thread_count_and_the_scaling():
    rows = [
        {"label": "memory copy", "size": 1000, "impl": "numpy", "gbps": 8.0, "ratio": 1.0},
        _kernel_row("qsgd 4-bit", 1000, 1.0, {"1": 0.5, "2": 0.9}),
        _kernel_row("signsgd", 1000, 2.0, {"2": 1.5, "1": 1.0}),
    ]
    table = bench_ops.format_table(rows).splitlines()
    assert table[0].endswith("| ratio | 1 thr GB/s | 2 thr GB/s | 2 thr / 1 thr |")
    assert table[2].startswith("| memory copy (NumPy) | 1,000 |")
    assert table[3].endswith("| 6.3x | 0.50 | 0.90 | 1.80x |")
    assert table[4].endswith("| 6.3x | 1.00 | 1.50 | 1.50x |")
    # Every line has as many cells as the header.
    assert len({line.count("|") for line in table}) == 1


def test_table_without_thread_counts_has_no_thread_columns():
    table = bench_ops.format_table([_kernel_row("qsgd 4-bit", 1000, 1.0)])
    assert "thr" not in table
    assert table.splitlines()[0].endswith("| ratio |")


def test_sum_table_reports_milliseconds_per_thread_count():
    rows = [
        {
            "label": bench_ops.SUM_LABEL,
            "size": 1000,
            "payloads": 4,
            "fused_seconds": 0.004,
            "separate_seconds": 0.008,
            "memcpy_seconds": 0.001,
            "threads_seconds": {"1": 0.006, "2": 0.004},
        }
    ]
    table = bench_ops.format_sum_table(rows).splitlines()
    assert table[0].endswith("| one pass, 1 thr (ms) | one pass, 2 thr (ms) | 2 thr / 1 thr |")
    assert table[2].endswith("| 4.0x | 6.0 | 4.0 | 1.50x |")
    assert len({line.count("|") for line in table}) == 1


def test_bench_ops_measures_each_kernel_row_at_one_and_two_threads(tmp_path, kernel_library):
    proc = run_cli(
        "ops",
        "--sizes",
        "20000",
        "--repeats",
        "1",
        "--only",
        "qsgd 4-bit",
        "signsgd",
        "--kernels-only",
        "--sum-payloads",
        "2",
        "--threads",
        "1",
        "2",
        "--out",
        str(tmp_path),
    )
    assert "| 1 thr GB/s | 2 thr GB/s | 2 thr / 1 thr |" in proc.stdout
    assert "| one pass, 1 thr (ms) | one pass, 2 thr (ms) |" in proc.stdout
    rows = json.loads((tmp_path / "ops.json").read_text())
    kernels = [r for r in rows if r.get("impl") == "kernel"]
    assert {r["label"] for r in kernels} == {"qsgd 4-bit", "signsgd"}
    for row in kernels:
        assert set(row["threads_gbps"]) == {"1", "2"}, row
        assert all(gbps > 0 for gbps in row["threads_gbps"].values()), row
    (sums,) = [r for r in rows if r["label"] == bench_ops.SUM_LABEL]
    assert set(sums["threads_seconds"]) == {"1", "2"}
    assert (tmp_path / "ops.md").read_text().count("thr") >= 4


def test_no_thread_counts_no_children(tmp_path, kernel_library):
    proc = run_cli(
        "ops",
        "--sizes",
        "5000",
        "--repeats",
        "1",
        "--only",
        "signsgd",
        "--kernels-only",
        "--threads",
        "--out",
        str(tmp_path),
    )
    assert "thr GB/s" not in proc.stdout
    rows = json.loads((tmp_path / "ops.json").read_text())
    assert all("threads_gbps" not in r for r in rows)
