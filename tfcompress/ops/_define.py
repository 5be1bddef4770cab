"""One definition per op: its public wrapper and its reference twin both come from it.

An op is one Python function (the habit of TensorFlow Addons), decorated
with :func:`define_op`. Its signature, annotations and docstring are the
public ones; its body converts and checks the arguments and hands the
kernel's inputs and attributes, by the kernel's names, to :func:`dispatch`,
which runs the C++ kernel or the pure-TensorFlow reference
(:mod:`tfcompress.ops.reference`) with them::

    @define_op
    def top_k_magnitudes(x, k, tensor_name=None, name=None):
        \"\"\"The public docstring.\"\"\"
        x, k = _to_floats(x, "TopK", "x"), to_integer_scalar(k, "TopK", "k")
        tensor_name = tensor_name or graph_name(x)
        return dispatch("TopK", reference.top_k_magnitudes, x=x, k=k, tensor_name=tensor_name)

    top_k_magnitudes_reference = top_k_magnitudes.reference

The last parameter is ``name``: the wrapper runs the body inside
``tf.name_scope(name or "top_k_magnitudes")``. The wrapper follows the
kernel/reference switch (:mod:`tfcompress.ops._loader`); its twin, the
``reference`` attribute, is the same function run with every
:func:`dispatch` inside it forced to the reference.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from tfcompress.ops import _loader

__all__ = ["define_op", "dispatch", "is_op"]

R = TypeVar("R")

# True while a reference twin runs (in this thread or task).
_force_reference: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tfcompress_force_reference", default=False
)


def dispatch(kernel: str | None, reference: Callable[..., R], /, **inputs: Any) -> R:
    """Runs the kernel named ``kernel``, or ``reference``, with the same named inputs.

    Args:
        kernel: the kernel's name without prefix (``"TopK"``); None for an op
            that is pure TensorFlow under both settings of the switch.
        reference: the pure-TensorFlow implementation.
        **inputs: the kernel's inputs and attributes, converted and checked.

    Returns:
        The kernel's outputs (a tuple when there are several) when the switch
        chooses the kernel and no twin is running, else ``reference(**inputs)``.
    """
    if kernel is not None and not _force_reference.get() and _loader.use_kernel(kernel):
        outputs = _loader.kernel_op(kernel)(**inputs)
        # The generated wrappers return a namedtuple for several outputs.
        return tuple(outputs) if isinstance(outputs, tuple) else outputs
    return reference(**inputs)


def define_op(
    definition: Callable[..., Any] | None = None, /, *, reference_summary: str | None = None
) -> Any:
    """Makes an op's public wrapper and its reference twin from its definition.

    Use as ``@define_op`` or ``@define_op(reference_summary=...)``.

    Args:
        definition: the op's function; its last parameter must be ``name``.
        reference_summary: first line of the twin's docstring (default:
            "Pure-TensorFlow :func:`<name>`, bit-identical to the C++ kernel.").

    Returns:
        The wrapper, with its twin ``<name>_reference`` as attribute ``reference``.

    Raises:
        TypeError: the last parameter is not ``name``.
    """
    if definition is None:
        return functools.partial(define_op, reference_summary=reference_summary)
    public, signature = definition.__name__, inspect.signature(definition)
    parameters = list(signature.parameters)
    if not parameters or parameters[-1] != "name":
        raise TypeError(f"define_op: the last parameter of {public} must be `name`")
    position = len(parameters) - 1

    def run(force_reference: bool, scope: str, args: tuple, kwargs: dict) -> Any:
        name = kwargs.get("name", args[position] if len(args) > position else None)
        token = _force_reference.set(True) if force_reference else None
        try:
            with tf.name_scope(name or scope):
                return definition(*args, **kwargs)
        finally:
            if token is not None:
                _force_reference.reset(token)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run(False, public, args, kwargs)

    def twin(*args: Any, **kwargs: Any) -> Any:
        return run(True, public + "_reference", args, kwargs)

    for function, name, doc in (
        (wrapper, public, definition.__doc__),
        (twin, public + "_reference", _twin_doc(public, definition.__doc__, reference_summary)),
    ):
        function.__name__ = function.__qualname__ = name
        function.__module__, function.__doc__ = definition.__module__, doc
        function.__annotations__ = dict(definition.__annotations__)
        function.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.reference = twin  # type: ignore[attr-defined]
    return wrapper


def is_op(function: Any) -> bool:
    """Whether ``function`` is a public wrapper made by :func:`define_op`."""
    return callable(getattr(function, "reference", None)) and hasattr(function, "__signature__")


def _twin_doc(public: str, doc: str | None, summary: str | None) -> str:
    """A summary, then the wrapper's Args, Returns and Raises (not its examples)."""
    lines = [
        summary or f"Pure-TensorFlow :func:`{public}`, bit-identical to the C++ kernel.",
        "",
        f"Takes the arguments of :func:`{public}` and gives its results and errors whatever",
        "the kernel/reference switch says; it never builds or loads the op library.",
        "",
    ]
    sections = inspect.cleandoc(doc or "").splitlines()
    start = next((i for i, line in enumerate(sections) if line == "Args:"), len(sections))
    for line in sections[start:]:
        if line.startswith(">>>"):
            break
        lines.append(line)
    return "\n".join(lines).rstrip() + "\n"
