"""Loads the custom-op library on first use and chooses kernel or reference.

Every op in :mod:`tfcompress.ops` has two implementations that give
bit-identical results: a C++ kernel (``custom_ops/``, compiled on first use by
:mod:`tfcompress.ops._build`, or prebuilt in a platform wheel when it fits the
installed TensorFlow: :func:`tfcompress.ops._build.library_for_process`) and a
pure-TensorFlow reference. One switch picks
between them:

* the environment variable ``TFCOMPRESS_OPS``: ``auto`` (the default),
  ``kernel`` or ``reference``;
* overridden at run time by :func:`set_implementation` or, for a block, the
  :func:`implementation` context manager.

``auto`` uses the kernel when the library builds and loads, and otherwise the
reference, after one warning per process that says why and what fixes it.
``kernel`` raises instead of falling back; ``reference`` never builds or loads
anything.

The fallback can also be per domain: a library built without a system library
(zlib: :func:`tfcompress.ops._build.left_out`) lacks the kernels of the domain
that needs it, and in ``auto`` mode only those ops run their reference, after
one warning per missing library that names the package to install.

GPU kernels are per domain too. When an op is asked to run on a GPU (a GPU is
visible and the device scope is not a CPU) and its domain has GPU sources
(``custom_ops/<domain>/cc/kernels/*_gpu.cu.cc``) that the loaded library was
built without (no nvcc, TensorFlow not a CUDA build, ...: the reason is in the
library's ``build_info.json``), ``auto`` runs the op's reference, on the GPU,
instead of the CPU kernel with a round trip through host memory, and warns
once per op with the op's name and the reason; ``kernel`` runs the CPU kernel
(TensorFlow places it on the CPU) after the same one warning. Ops of domains
without GPU sources (Deflate, which stays on the CPU; WallClockAfter, whose GPU
kernel is registered with its CPU one) run their kernel wherever TensorFlow
places it.

Inside ``tf.function`` the choice is made while tracing: a traced function
keeps the implementation it was traced with.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import pathlib
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from tfcompress.ops import _build

__all__ = [
    "ENV_VAR",
    "IMPLEMENTATIONS",
    "get_implementation",
    "implementation",
    "kernel_available",
    "kernel_op",
    "load_library",
    "loaded_library_path",
    "op_name",
    "set_implementation",
    "use_kernel",
]

ENV_VAR = "TFCOMPRESS_OPS"
IMPLEMENTATIONS = ("auto", "kernel", "reference")

# The only place in Python where the op-name prefix is written; its C++ twin is
# TFCOMPRESS_OP_NAME in custom_ops/common/cc/op_prefix.h.
_OP_PREFIX = "TFCompress>"

_lock = threading.RLock()
_override: str | None = None
_library: types.ModuleType | None = None
# The op wrappers of the loaded library (by its id, with the library itself so
# that an id is never taken for another's), marked for AutoGraph once (kernel_op).
_marked: dict[int, tuple[Any, dict[str, Callable[..., Any]]]] = {}
_library_path: pathlib.Path | None = None
_library_error: Exception | None = None
_fallback_warned = False
# What the loaded library was built without ({domain: LeftOut}), and which
# missing system libraries were already reported.
_left_out_domains: dict[str, _build.LeftOut] = {}
_left_out_warned: set[str] = set()
_op_domains: dict[str, str] | None = None  # op name -> domain, read from the sources once
# What the loaded library holds on the GPU (build_info.json's "gpu"), and the
# ops already reported for running without a GPU kernel.
_gpu_built: _build.GpuBuild | None = None
_gpu_source_domains: frozenset[str] = frozenset()
_gpu_warned: set[str] = set()


def op_name(name: str) -> str:
    """Returns the registered name of a tfcompress op.

    Args:
        name: the op's name without prefix, e.g. ``"PackBits"``.

    Returns:
        ``"TFCompress>" + name``.

    >>> op_name("PackBits")
    'TFCompress>PackBits'
    """
    return _OP_PREFIX + name


def _validate(name: str, origin: str) -> str:
    if not isinstance(name, str) or name.strip().lower() not in IMPLEMENTATIONS:
        raise ValueError(
            f"{origin} must be one of {', '.join(repr(i) for i in IMPLEMENTATIONS)}; got {name!r}"
        )
    return name.strip().lower()


def get_implementation() -> str:
    """Returns the configured implementation: ``"auto"``, ``"kernel"`` or ``"reference"``.

    The run-time override (:func:`set_implementation`) wins over the
    ``TFCOMPRESS_OPS`` environment variable, which defaults to ``"auto"``.

    Raises:
        ValueError: ``TFCOMPRESS_OPS`` holds something else.
    """
    if _override is not None:
        return _override
    return _validate(os.environ.get(ENV_VAR) or "auto", f"${ENV_VAR}")


def set_implementation(name: str | None) -> None:
    """Chooses the implementation for the whole process.

    Args:
        name: ``"auto"``, ``"kernel"``, ``"reference"``, or None to go back to
            the ``TFCOMPRESS_OPS`` environment variable.

    Raises:
        ValueError: ``name`` is not one of those.
    """
    global _override
    _override = None if name is None else _validate(name, "implementation")


@contextlib.contextmanager
def implementation(name: str) -> Iterator[None]:
    """Uses the given implementation inside a ``with`` block.

    The setting is process-wide while the block runs (not per thread), and the
    previous one is restored on exit.

    Args:
        name: ``"auto"``, ``"kernel"`` or ``"reference"``.

    Raises:
        ValueError: ``name`` is not one of those.

    >>> with implementation("reference"):
    ...     get_implementation()
    'reference'
    """
    global _override
    previous = _override
    set_implementation(name)
    try:
        yield
    finally:
        _override = previous


def load_library() -> types.ModuleType:
    """Builds (if needed) and loads the op library, once per process.

    Returns:
        The module that ``tf.load_op_library`` returned.

    Raises:
        BuildError: the library could not be built.
        Exception: whatever ``tf.load_op_library`` raised. A failure is
            remembered, and raised again by later calls without retrying.
    """
    global _library, _library_path, _library_error, _left_out_domains
    with _lock:
        if _library is not None:
            return _library
        if _library_error is not None:
            raise _library_error
        try:
            import tensorflow as tf

            path = _build.library_for_process()
            library = tf.load_op_library(str(path))
        except Exception as error:
            _library_error = error
            raise
        _left_out_domains = _read_left_out(path)
        _read_gpu(path)
        _library, _library_path = library, path
        return library


def _read_left_out(path: pathlib.Path) -> dict[str, _build.LeftOut]:
    """The domains a built library lacks, from the ``build_info.json`` beside it."""
    return {domain: item for item in _build.library_left_out(path) for domain in item.domains}


def _read_gpu(path: pathlib.Path) -> None:
    """Reads which domains of the library at ``path`` have GPU kernels, and why not the others."""
    global _gpu_built, _gpu_source_domains
    try:
        gpu = json.loads((path.parent / "build_info.json").read_text())["gpu"]
        _gpu_built = _build.GpuBuild(
            domains=tuple(gpu["domains"]), reason=gpu["reason"], archs=tuple(gpu["archs"])
        )
        _gpu_source_domains = frozenset(gpu["with_sources"])
    except (OSError, ValueError, TypeError, KeyError):  # a library built before GPU kernels
        _gpu_built = _build.GpuBuild(reason="its build recorded no GPU kernels")
        _gpu_source_domains = frozenset()


def loaded_library_path() -> pathlib.Path | None:
    """Returns the path of the loaded library, or None when none is loaded."""
    return _library_path


def kernel_available() -> bool:
    """Returns whether the C++ kernels can be used, building them if needed.

    Unlike the ops themselves this ignores the implementation switch: it
    answers whether ``TFCOMPRESS_OPS=kernel`` would work.
    """
    try:
        load_library()
    except Exception:
        return False
    return True


def use_kernel(kernel: str | None = None) -> bool:
    """Decides, for one op call, whether to run the kernel or the reference.

    Args:
        kernel: the op's name without prefix (``"DeflateEncode"``); when given,
            an op whose domain the library was built without (a missing
            system library) runs its reference too.

    Raises:
        Exception: in ``kernel`` mode, why the library cannot be loaded.
        MissingLibraryError: in ``kernel`` mode, the op's kernel was left out.
    """
    global _fallback_warned
    mode = get_implementation()
    if mode == "reference":
        return False
    if mode == "kernel":
        load_library()
    else:
        try:
            load_library()
        except Exception as error:
            with _lock:
                if not _fallback_warned:
                    _fallback_warned = True
                    warnings.warn(
                        _fallback_message(error), RuntimeWarning, stacklevel=_caller_level()
                    )
            return False
    if kernel is None:
        return True
    if _gpu_source_domains and not _gpu_kernel_for(kernel, mode):
        return False
    if not _left_out_domains:
        return True
    left_out = _left_out_for(kernel)
    if left_out is None:
        return True
    if mode == "kernel":
        raise _build.MissingLibraryError(left_out.message(), hint=left_out.install_hint)
    with _lock:
        if left_out.library not in _left_out_warned:
            _left_out_warned.add(left_out.library)
            warnings.warn(left_out.message(), RuntimeWarning, stacklevel=_caller_level())
    return False


def _gpu_kernel_for(kernel: str, mode: str) -> bool:
    """Whether ``kernel`` may run as a kernel where it is asked to run.

    False only in ``auto`` mode, for an op asked to run on a GPU whose domain
    has GPU sources that the loaded library lacks: it then runs its reference,
    on the GPU. Warns once per op in that case (and in ``kernel`` mode, where
    the CPU kernel runs).
    """
    domain = _domain_of(kernel)
    if domain not in _gpu_source_domains or domain in _gpu_built.domains:
        return True
    device = _gpu_requested()
    if device is None:
        return True
    with _lock:
        if kernel not in _gpu_warned:
            _gpu_warned.add(kernel)
            warnings.warn(
                _gpu_fallback_message(kernel, device, mode),
                RuntimeWarning,
                stacklevel=_caller_level(),
            )
    return mode == "kernel"


def _gpu_fallback_message(kernel: str, device: str, mode: str) -> str:
    instead = (
        "TensorFlow runs its CPU kernel instead (TFCOMPRESS_OPS=kernel), copying through host memory"
        if mode == "kernel"
        else "it runs its pure-TensorFlow reference there instead (same results, slower)"
    )
    return (
        f"tfcompress: {op_name(kernel)} was asked to run on {device}, but the op library has no "
        f"GPU kernel for it (no GPU kernels in this build: {_gpu_built.reason}); {instead}. "
        "Once the cause is fixed, `tfcompress ops build --force` builds them."
    )


@functools.cache
def _visible_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_logical_devices("GPU"))


def _gpu_requested() -> str | None:
    """The GPU an op created here and now would be placed on, or None.

    None when TensorFlow sees no GPU or the device scope names a CPU. An
    empty scope means TensorFlow's default placement: the first GPU.
    """
    if not _visible_gpus():
        return None
    import tensorflow as tf

    if tf.executing_eagerly():
        device = tf.identity(0.0).device
    else:  # while tracing: the scope's device, which a no-op records ("" for none)
        device = tf.no_op().device
    if not device:
        return "GPU:0"
    spec = tf.DeviceSpec.from_string(device)
    if (spec.device_type or "GPU").upper() != "GPU":
        return None
    return f"GPU:{spec.device_index or 0}"


def _domain_of(kernel: str) -> str | None:
    global _op_domains
    if _op_domains is None:
        try:
            _op_domains = _build.op_domains()
        except (_build.BuildError, OSError):
            _op_domains = {}
    return _op_domains.get(kernel)


def _left_out_for(kernel: str) -> _build.LeftOut | None:
    """Why the loaded library lacks ``kernel``, or None when it has it (or nobody knows why)."""
    if hasattr(_library, op_name(kernel).replace(">", "_")):
        return None
    return _left_out_domains.get(_domain_of(kernel))


def kernel_op(name: str) -> Callable[..., Any]:
    """Returns the Python wrapper that ``tf.load_op_library`` generated for an op.

    Marked ``do_not_convert`` for AutoGraph (once per op and library).

    Args:
        name: the op's name without prefix, e.g. ``"PackBits"``.
    """
    library = load_library()
    entry = _marked.get(id(library))
    if entry is None or entry[0] is not library:
        entry = _marked[id(library)] = (library, {})
    wrappers = entry[1]
    wrapper = wrappers.get(name)
    if wrapper is None:
        import tensorflow as tf

        # TensorFlow's generated wrappers spell ">" as "_": TFCompress_PackBits.
        generated = getattr(library, op_name(name).replace(">", "_"))
        # AutoGraph converts what a converted function calls, but these wrappers
        # are built from generated code without a source file: it would fail to
        # read them and warn "could not transform" for every op of every trace
        # (TensorFlow's own generated wrappers are on its do-not-convert list).
        # Marked once per op: eagerly this runs at every call of the op.
        wrapper = wrappers[name] = tf.autograph.experimental.do_not_convert(generated)
    return wrapper


def _caller_level() -> int:
    """The ``stacklevel`` of the first caller outside tfcompress.ops (the op's user)."""
    package = str(pathlib.Path(__file__).parent)
    frame, level = inspect.currentframe().f_back, 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _fallback_message(error: Exception) -> str:
    reason = str(error).strip() or type(error).__name__
    hint = getattr(error, "hint", "")
    return (
        "tfcompress: the C++ op library is unavailable, so tfcompress.ops uses its "
        "pure-TensorFlow reference implementation (same results, slower).\n"
        f"Reason: {reason}\n"
        + (f"Fix: {hint}\n" if hint else "")
        + f"Set {ENV_VAR}=kernel to raise this error instead, or "
        f"{ENV_VAR}=reference to use the reference without this warning."
    )
