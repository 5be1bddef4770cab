"""One traced function per tensor layout for GradiVeQ's per-tensor graph code.

A sampling step's bookkeeping (:meth:`GradiVeQLayer.record`: the fit step,
the fold into the sketch, the self-check, the handshake) is about a
thousand graph operations per tensor, and inside a ``tf.function`` every
tensor used to trace its own copy: on a ResNet-20 that is 19 copies at the
first step, where the model has 6 distinct kernel layouts. Here the
bookkeeping of all tensors of one *layout* (same slicing geometry, sketch
and buffer sizes, dtype, worker count and replica: everything the Python
code of the bookkeeping reads except the tensor's state and name) is one
``tf.function``, traced once, which each tensor calls with its own state
variables and its name as arguments (``tf.function`` traces once for
variables of equal shapes and dtypes). TensorFlow inlines the call into the
step's graph, so what runs, and its bits, is what the per-tensor code built;
only the Python tracing is shared: ResNet-20's first aggregation took about
15-25% less (docs/bench/gradiveq-first-call; most of what remains is Grappler
on the inlined graph, which a ``_noinline`` call did not shorten: Grappler
specialises a copy per call site).

Eagerly (and outside a ``tf.function``) the method runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["call", "layout"]


class _NamelessContext:
    """A tensor context without its tensor's name, for the shared trace.

    The name differs between the tensors that share a trace; the traced
    code takes it as a string tensor (``GradiVeQLayer.key_text``), so reading
    ``key`` here is a bug and fails at trace time instead of printing the
    wrong tensor's name.
    """

    def __init__(self, context: Any):
        self._context = context

    def __getattr__(self, name: str) -> Any:
        if name == "key":
            raise AttributeError(
                "GradiVeQ's shared trace has no tensor name: use GradiVeQLayer.key_text"
            )
        return getattr(self._context, name)


def layout(layer: Any) -> tuple:
    """What the bookkeeping's Python code reads of a bound layer, apart from state and name.

    Two layers of equal layouts trace the same graph given the same
    arguments; anything added to :meth:`GradiVeQLayer.build_state` that the
    bookkeeping reads must be added here (the view of :func:`call` raises on
    the per-tensor attributes it drops).
    """
    context = layer.context
    return (
        id(layer.config),
        id(layer.schedule_),
        layer.size,
        layer.geometry,
        layer.rows_per_sample,
        layer.width,
        layer.buffer_rows,
        layer.fold_rows,
        layer.compute_dtype,
        tuple(layer.pack_bounds),
        layer._modulus,  # pylint: disable=protected-access
        layer.sketch_shape,
        layer.residual is None,
        tuple(tuple(v.shape.as_list()) for v in layer.state_variables().values()),
        context.num_replicas,
        context.replica,
        context.dtype,
        context.device,
    )


def call(layer: Any, method: str, *args: tf.Tensor) -> Any:
    """``getattr(layer, method)(*args)``, traced once per :func:`layout` inside a tf.function.

    The layer's config keeps the functions (``GradiVeQ._traced``), one per
    method and layout; each holds the first layer of its layout as a
    template and calls ``method`` on a shallow copy of it whose state
    variables, name and context are the caller's.
    """
    if tf.executing_eagerly() or not tf.inside_function():
        return getattr(layer, method)(*args)
    key = (method, layout(layer))
    functions = layer.config._traced  # pylint: disable=protected-access
    function = functions.get(key)
    if function is None:
        function = tf.function(_bound(layer, method), autograph=False)
        functions[key] = function
    variables = tuple(layer.state_variables().values())
    return function(variables, layer.key_text(), layer.sketch_seed(), *args)


def _bound(template: Any, method: str) -> Callable:
    """The traced body: ``method`` of a view of ``template`` bound to the arguments' state."""
    names = tuple(template.state_variables())
    context = _NamelessContext(template.context)

    def body(variables, key_text, sketch_seed, *args):
        state = dict(zip(names, variables, strict=True))
        view = template.view(state, key_text, sketch_seed, context)
        return getattr(view, method)(*args)

    body.__name__ = f"gradiveq_{method.strip('_')}"
    return body
