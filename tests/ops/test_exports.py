"""``tfcompress.ops`` re-exports the op modules' ops, loading the modules lazily.

Each name of ``_LAZY_EXPORTS`` must be public in its module and reach the same
object through the package (the modules' constants and helpers, such as
``MAX_BITS`` or ``read_uint64``, stay in their modules).
"""

import importlib

import pytest

import tfcompress.ops
from tfcompress.ops import _LAZY_EXPORTS


@pytest.mark.parametrize("module_name", sorted(_LAZY_EXPORTS))
def test_lazy_exports_reach_the_op_modules_public_names(module_name):
    module = importlib.import_module(f"tfcompress.ops.{module_name}")
    for name in _LAZY_EXPORTS[module_name]:
        assert name in module.__all__, name
        assert getattr(tfcompress.ops, name) is getattr(module, name)
        assert name in tfcompress.ops.__all__


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_op"):
        tfcompress.ops.no_such_op  # noqa: B018
