"""Tests of the Fashion-MNIST IDX loader, on the real files and on tiny synthetic ones."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from tfcompress.data import CLASS_NAMES, load_fashion_mnist, read_idx
from tfcompress.data import fashion_mnist as fashion_mnist_module

FILE_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

real_data = pytest.mark.skipif(
    not (fashion_mnist_module.DEFAULT_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    content = idx_bytes(array)
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(content))
    else:
        path.write_bytes(content)
    return path


def synthetic_arrays(n_train: int = 12, n_test: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": (np.arange(n_train) % 10).astype(np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": (np.arange(n_test)[::-1] % 10).astype(np.uint8),
    }


def write_dataset(
    directory: Path, arrays: dict[str, np.ndarray], compress: bool = True
) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return {
        key: write_idx(directory / FILE_NAMES[key], array, compress)
        for key, array in arrays.items()
    }


@real_data
def test_real_data_shapes_and_labels():
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist()
    assert x_train.shape == (60000, 28, 28, 1) and x_train.dtype == np.float32
    assert x_test.shape == (10000, 28, 28, 1) and x_test.dtype == np.float32
    assert y_train.shape == (60000,) and y_test.shape == (10000,)
    assert y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert x_train.max() == 1.0
    assert set(np.unique(y_train)) == set(range(10))
    assert set(np.unique(y_test)) == set(range(10))
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert np.bincount(y_test).tolist() == [1000] * 10
    # The first training labels, as published (ankle boot, T-shirt, T-shirt, dress).
    assert y_train[:4].tolist() == [9, 0, 0, 3]


@real_data
def test_real_data_raw_subset():
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(subset=100, normalize=False)
    assert x_train.shape == (100, 28, 28) and x_train.dtype == np.uint8
    assert x_test.shape == (100, 28, 28) and x_test.dtype == np.uint8
    assert y_train.shape == (100,) and y_test.shape == (100,)
    assert x_train.flags.writeable


def test_synthetic_data_loads(tmp_path):
    arrays = synthetic_arrays()
    write_dataset(tmp_path, arrays)
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(tmp_path)
    assert x_train.shape == (12, 28, 28, 1) and x_train.dtype == np.float32
    np.testing.assert_allclose(x_train[..., 0] * 255.0, arrays["train_images"], atol=1e-4)
    np.testing.assert_allclose(x_test[..., 0] * 255.0, arrays["test_images"], atol=1e-4)
    np.testing.assert_array_equal(y_train, arrays["train_labels"])
    np.testing.assert_array_equal(y_test, arrays["test_labels"])
    assert y_train.dtype == np.int64


def test_raw_pixels(tmp_path):
    arrays = synthetic_arrays()
    write_dataset(tmp_path, arrays)
    (x_train, _), (x_test, _) = load_fashion_mnist(str(tmp_path), normalize=False)
    assert x_train.dtype == np.uint8
    np.testing.assert_array_equal(x_train, arrays["train_images"])
    np.testing.assert_array_equal(x_test, arrays["test_images"])


def test_uncompressed_files(tmp_path):
    arrays = synthetic_arrays()
    write_dataset(tmp_path, arrays, compress=False)
    (_, y_train), (x_test, _) = load_fashion_mnist(tmp_path, normalize=False)
    np.testing.assert_array_equal(y_train, arrays["train_labels"])
    np.testing.assert_array_equal(x_test, arrays["test_images"])


def test_subset_keeps_the_first_examples_of_each_split(tmp_path):
    arrays = synthetic_arrays(n_train=12, n_test=5)
    write_dataset(tmp_path, arrays)
    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(tmp_path, subset=8)
    assert x_train.shape == (8, 28, 28, 1) and y_train.shape == (8,)
    assert x_test.shape == (5, 28, 28, 1) and y_test.shape == (5,)
    np.testing.assert_array_equal(y_train, arrays["train_labels"][:8])
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="subset"):
            load_fashion_mnist(tmp_path, subset=bad)


def test_environment_variable_is_searched(tmp_path, monkeypatch):
    write_dataset(tmp_path / "fmnist", synthetic_arrays(n_train=3, n_test=2))
    monkeypatch.setenv("TFCOMPRESS_FASHION_MNIST_DIR", str(tmp_path / "fmnist"))
    (x_train, _), (x_test, _) = load_fashion_mnist()
    assert len(x_train) == 3 and len(x_test) == 2


def test_missing_directory_names_the_places_searched(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist(missing)
    message = str(info.value)
    assert str(missing) in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "path=" in message

    monkeypatch.setenv("TFCOMPRESS_FASHION_MNIST_DIR", str(missing))
    monkeypatch.setattr(fashion_mnist_module, "DEFAULT_DIR", tmp_path / "default")
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist()
    assert str(missing) in str(info.value)
    assert str(tmp_path / "default") in str(info.value)


def test_missing_file_is_named(tmp_path):
    paths = write_dataset(tmp_path, synthetic_arrays())
    paths["test_labels"].unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_fashion_mnist(tmp_path)


def test_truncated_file_raises_value_error(tmp_path):
    paths = write_dataset(tmp_path, synthetic_arrays(), compress=False)
    content = paths["train_images"].read_bytes()
    paths["train_images"].write_bytes(content[:-100])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*truncated"):
        load_fashion_mnist(tmp_path)


def test_truncated_gzip_raises_value_error(tmp_path):
    paths = write_dataset(tmp_path, synthetic_arrays())
    content = paths["test_images"].read_bytes()
    paths["test_images"].write_bytes(content[: len(content) // 2])
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        load_fashion_mnist(tmp_path)


def test_bad_magic_number_raises_value_error(tmp_path):
    paths = write_dataset(tmp_path, synthetic_arrays())
    paths["train_labels"].write_bytes(gzip.compress(b"\x12\x34\x56\x78" + bytes(100)))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz: not an IDX file"):
        load_fashion_mnist(tmp_path)


def test_inconsistent_files_raise_value_error(tmp_path):
    arrays = synthetic_arrays()
    arrays["train_labels"] = arrays["train_labels"][:-1]
    write_dataset(tmp_path, arrays)
    with pytest.raises(ValueError, match="11 labels for 12 images"):
        load_fashion_mnist(tmp_path)

    arrays = synthetic_arrays()
    arrays["test_labels"][0] = 10
    write_dataset(tmp_path, arrays)
    with pytest.raises(ValueError, match="label 10"):
        load_fashion_mnist(tmp_path)

    arrays = synthetic_arrays()
    arrays["test_images"] = np.zeros((5, 28, 27), np.uint8)
    write_dataset(tmp_path, arrays)
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz"):
        load_fashion_mnist(tmp_path)


def test_read_idx_other_types_and_byte_order(tmp_path):
    values = np.arange(-6, 6, dtype=">i4").reshape(3, 4)
    path = tmp_path / "values.idx"
    path.write_bytes(idx_bytes(values, type_code=0x0C))
    loaded = read_idx(path)
    assert loaded.dtype == np.dtype(np.int32) and loaded.dtype.isnative
    np.testing.assert_array_equal(loaded, values)


def test_class_names():
    assert len(CLASS_NAMES) == 10
    assert CLASS_NAMES[9] == "Ankle boot"
