"""Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017) from local IDX files, with numpy only.

The data set is 70,000 28x28 grayscale images of clothing in 10 classes, 60,000 for
training and 10,000 for testing, stored in the IDX format of the original MNIST. Debian
installs it with ``apt-get install dataset-fashion-mnist`` into
``/usr/share/datasets/fashion-mnist/``; nothing is downloaded here, so the examples and
tests run offline.

IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian header of two zero
bytes, a type code (``0x08`` for unsigned bytes), the number of dimensions ``d``, and
``d`` big-endian 32-bit sizes, followed by the data in C order.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_DIR",
    "ENV_VAR",
    "load_fashion_mnist",
    "read_idx",
]

#: Where Debian's ``dataset-fashion-mnist`` package installs the files.
DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")

#: Environment variable naming a directory to search before :data:`DEFAULT_DIR`.
ENV_VAR = "TFCOMPRESS_FASHION_MNIST_DIR"

#: The class of each label, 0 to 9.
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_IMAGE_SIZE = 28

# Base names of the four files; each may also be stored gzipped, as ``NAME.gz``.
_TRAIN_IMAGES = "train-images-idx3-ubyte"
_TRAIN_LABELS = "train-labels-idx1-ubyte"
_TEST_IMAGES = "t10k-images-idx3-ubyte"
_TEST_LABELS = "t10k-labels-idx1-ubyte"
_FILES = (_TRAIN_IMAGES, _TRAIN_LABELS, _TEST_IMAGES, _TEST_LABELS)

# IDX type code -> element type (big-endian where it matters).
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(file: str | os.PathLike) -> np.ndarray:
    """Reads one IDX file, gzipped (name ending in ``.gz``) or not.

    Args:
        file: Path of the file.

    Returns:
        The array, with the file's shape and element type, in native byte order.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: Naming the file, if it is not IDX, or is truncated or corrupt.
    """
    file = Path(file)
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as stream:
                content = stream.read()
        else:
            content = file.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"{file}: corrupt or truncated gzip data ({error})") from error

    if len(content) < 4:
        raise ValueError(f"{file}: too short for an IDX header ({len(content)} bytes)")
    zeros, type_code, ndim = content[0:2], content[2], content[3]
    if zeros != b"\x00\x00" or type_code not in _IDX_DTYPES:
        raise ValueError(f"{file}: not an IDX file (magic number {content[:4].hex()})")
    header_size = 4 + 4 * ndim
    if len(content) < header_size:
        raise ValueError(f"{file}: truncated IDX header (expected {ndim} dimensions)")
    shape = tuple(int(size) for size in np.frombuffer(content, ">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(content) - header_size
    if found != expected:
        problem = "truncated" if found < expected else "longer than its header says"
        raise ValueError(
            f"{file}: {problem}: shape {shape} needs {expected} bytes of data, found {found}"
        )
    data = np.frombuffer(content, dtype, offset=header_size).reshape(shape)
    # A copy in native byte order: writable, unlike a view of the bytes read.
    return data.astype(dtype.newbyteorder("="))


def load_fashion_mnist(
    path: str | os.PathLike | None = None,
    *,
    subset: int | None = None,
    normalize: bool = True,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads Fashion-MNIST from local IDX files, like ``keras.datasets.fashion_mnist``.

    The files are ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each gzipped (``.gz``)
    or not. They are looked for in ``path`` if given; otherwise in the directory named
    by ``$TFCOMPRESS_FASHION_MNIST_DIR`` if set, then in
    ``/usr/share/datasets/fashion-mnist/``. The first directory holding all four wins.

    Args:
        path: Directory holding the four files.
        subset: Keep only the first ``min(subset, n)`` examples of each split, the
            training split and the test split alike (for quick runs).
        normalize: If true, images are float32 in ``[0, 1]`` with shape
            ``(n, 28, 28, 1)``, ready for a Keras ``Conv2D``; if false, the raw uint8
            pixels with shape ``(n, 28, 28)``.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``; labels are int64 of shape ``(n,)``
        with values 0 to 9 (see :data:`CLASS_NAMES`).

    Raises:
        FileNotFoundError: If no searched directory holds all four files; the message
            lists each directory searched and what it lacks.
        ValueError: If ``subset`` is not positive, or a file is corrupt, truncated, or
            inconsistent with the others (the message names the file).
    """
    if subset is not None and (isinstance(subset, bool) or subset < 1):
        raise ValueError(f"subset must be a positive integer or None, got {subset!r}")
    files = _find_files(_search_dirs(path))
    train = _load_split(files[_TRAIN_IMAGES], files[_TRAIN_LABELS], subset, normalize)
    test = _load_split(files[_TEST_IMAGES], files[_TEST_LABELS], subset, normalize)
    return train, test


def _search_dirs(path: str | os.PathLike | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    dirs = []
    if os.environ.get(ENV_VAR):
        dirs.append(Path(os.environ[ENV_VAR]))
    dirs.append(DEFAULT_DIR)
    return dirs


def _find_files(dirs: Sequence[Path]) -> dict[str, Path]:
    """Finds the four files in the first directory that holds them all."""
    searched = []
    for directory in dirs:
        if not directory.is_dir():
            searched.append(f"{directory} (no such directory)")
            continue
        found, missing = {}, []
        for name in _FILES:
            candidates = [directory / f"{name}.gz", directory / name]
            existing = [candidate for candidate in candidates if candidate.is_file()]
            if existing:
                found[name] = existing[0]
            else:
                missing.append(f"{name}[.gz]")
        if not missing:
            return found
        searched.append(f"{directory} (missing {', '.join(missing)})")
    raise FileNotFoundError(
        "Fashion-MNIST IDX files not found; searched: "
        + "; ".join(searched)
        + ". Install them with `apt-get install dataset-fashion-mnist`, "
        + f"set ${ENV_VAR}, or pass path= to load_fashion_mnist()."
    )


def _load_split(
    images_file: Path, labels_file: Path, subset: int | None, normalize: bool
) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_file)
    labels = read_idx(labels_file)
    if images.dtype != np.uint8 or images.shape[1:] != (_IMAGE_SIZE, _IMAGE_SIZE):
        raise ValueError(
            f"{images_file}: expected uint8 images of shape (n, {_IMAGE_SIZE}, {_IMAGE_SIZE}), "
            f"found {images.dtype} {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{labels_file}: expected uint8 labels of shape (n,), found {labels.shape}"
        )
    if len(labels) != len(images):
        raise ValueError(
            f"{labels_file}: {len(labels)} labels for {len(images)} images in {images_file}"
        )
    if labels.size and labels.max() >= len(CLASS_NAMES):
        raise ValueError(f"{labels_file}: label {labels.max()} is not in 0..9")
    if subset is not None:
        # Copies, so that a small subset does not keep the whole file in memory.
        images, labels = images[:subset].copy(), labels[:subset].copy()
    if normalize:
        images = (images.astype(np.float32) / np.float32(255.0))[..., np.newaxis]
    return images, labels.astype(np.int64)
