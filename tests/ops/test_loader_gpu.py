"""The loader's GPU fallback, simulated (this machine has no GPU).

A library whose build had GPU sources it could not compile (build_info.json's
"gpu": no domains built, and why) is stood in for by a module and a written
build_info.json; where an op is asked to run is simulated by replacing
``_loader._gpu_requested``. The real ``_gpu_requested`` is asked only here,
where TensorFlow sees no GPU.
"""

from __future__ import annotations

import json
import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfcompress import ops
from tfcompress.ops import _build, _loader

REASON = "nvcc 13.0 (/usr/local/bin/nvcc) is not CUDA 12, which TensorFlow was built with"


def _library_without_gpu_kernels(monkeypatch, tmp_path, built=(), with_sources=("bitpack",)):
    """The loader's state after loading a library whose bitpack GPU sources were not compiled."""
    (tmp_path / "build_info.json").write_text(
        json.dumps(
            {
                "gpu": {
                    "domains": list(built),
                    "with_sources": list(with_sources),
                    "reason": "" if built else REASON,
                    "archs": [],
                }
            }
        )
    )
    monkeypatch.setattr(_loader, "_gpu_built", None)
    monkeypatch.setattr(_loader, "_gpu_source_domains", frozenset())
    monkeypatch.setattr(_loader, "_gpu_warned", set())
    _loader._read_gpu(tmp_path / "libtfcompress_ops.so")
    library = types.SimpleNamespace(TFCompress_PackBits=None, TFCompress_QsgdEncode=None)
    monkeypatch.setattr(_loader, "_library", library)
    monkeypatch.setattr(_loader, "_library_error", None)
    monkeypatch.setattr(_loader, "_left_out_domains", {})


def _messages(caught) -> list[str]:
    return [str(w.message) for w in caught if "tfcompress" in str(w.message)]


def test_an_op_asked_to_run_on_a_gpu_without_its_gpu_kernel_runs_its_reference(
    monkeypatch, tmp_path
):
    _library_without_gpu_kernels(monkeypatch, tmp_path)
    monkeypatch.setattr(_loader, "_gpu_requested", lambda: "GPU:0")
    values = np.array([5, 1, 7])
    with warnings.catch_warnings(record=True) as caught, ops.implementation("auto"):
        warnings.simplefilter("always")
        assert not _loader.use_kernel("PackBits")
        packed = ops.pack_bits(values, 3)  # the reference: the stand-in library has no kernels
        ops.pack_bits(values, 3)
        assert not _loader.use_kernel("UnpackBits")
        # quantize has no GPU sources: its kernel runs wherever TensorFlow places it.
        assert _loader.use_kernel("QsgdEncode")
    assert packed.numpy().tolist() == [0xCD, 0x01]
    messages = _messages(caught)
    assert len(messages) == 2, messages  # one per op
    first, second = messages
    assert "TFCompress>PackBits was asked to run on GPU:0" in first
    assert f"no GPU kernels in this build: {REASON}" in first
    assert "pure-TensorFlow reference" in first and "\n" not in first
    assert "TFCompress>UnpackBits" in second


def test_in_kernel_mode_the_cpu_kernel_runs_after_the_same_message(monkeypatch, tmp_path):
    _library_without_gpu_kernels(monkeypatch, tmp_path)
    monkeypatch.setattr(_loader, "_gpu_requested", lambda: "GPU:1")
    with warnings.catch_warnings(record=True) as caught, ops.implementation("kernel"):
        warnings.simplefilter("always")
        assert _loader.use_kernel("PackBits")
        assert _loader.use_kernel("PackBits")
    (message,) = _messages(caught)
    assert "TFCompress>PackBits was asked to run on GPU:1" in message
    assert "CPU kernel" in message and REASON in message


@pytest.mark.parametrize("case", ["gpu kernels built", "placed on the CPU", "reference mode"])
def test_no_fallback_where_the_gpu_kernel_exists_or_no_gpu_is_asked_for(
    monkeypatch, tmp_path, case
):
    if case == "gpu kernels built":
        _library_without_gpu_kernels(monkeypatch, tmp_path, built=("bitpack",))
        monkeypatch.setattr(_loader, "_gpu_requested", lambda: "GPU:0")
    else:
        _library_without_gpu_kernels(monkeypatch, tmp_path)
        monkeypatch.setattr(_loader, "_gpu_requested", lambda: None)
    mode = "reference" if case == "reference mode" else "auto"
    with warnings.catch_warnings(record=True) as caught, ops.implementation(mode):
        warnings.simplefilter("always")
        assert _loader.use_kernel("PackBits") == (mode == "auto")
    assert _messages(caught) == []


def test_a_library_built_before_gpu_kernels_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(_loader, "_gpu_built", None)
    monkeypatch.setattr(_loader, "_gpu_source_domains", frozenset({"x"}))
    (tmp_path / "build_info.json").write_text(json.dumps({"tensorflow": tf.__version__}))
    _loader._read_gpu(tmp_path / "libtfcompress_ops.so")
    assert _loader._gpu_built == _build.GpuBuild(reason="its build recorded no GPU kernels")
    assert _loader._gpu_source_domains == frozenset()


def test_without_a_visible_gpu_nothing_is_asked_to_run_on_one():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this machine has a GPU: the simulation above covers it")
    assert _loader._gpu_requested() is None
    with tf.device("/CPU:0"):
        assert _loader._gpu_requested() is None
