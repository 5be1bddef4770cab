import importlib
import pkgutil

import pytest

import tests.compressors as package
from tests.compressors.conformance import CompressorConformance
from tfcompress import compressors


def test_get_by_name_with_options():
    c = compressors.get("FP16", dtype="bfloat16")
    assert isinstance(c, compressors.FP16) and c.dtype == "bfloat16"
    assert isinstance(compressors.get("identity"), compressors.Identity)


def test_none_and_instances_pass_through():
    assert compressors.get(None) is None
    assert compressors.get("none") is None
    c = compressors.Identity()
    assert compressors.get(c) is c


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown compressor 'zip'.*'fp16'.*'identity'"):
        compressors.get("zip")


def test_unknown_option_lists_valid_options():
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) \['bits'\].*\['dtype', 'predivide'\]"
    ):
        compressors.get("fp16", bits=4)


def test_options_need_a_name():
    with pytest.raises(ValueError):
        compressors.get(compressors.Identity(), dtype="float16")


def test_available_lists_registered():
    assert {"identity", "fp16"} <= set(compressors.available())


def test_missing_required_option_is_named():
    with pytest.raises(ValueError, match=r"'diana' needs option\(s\) \['inner'\]"):
        compressors.get("diana")
    assert isinstance(compressors.get("diana", inner="pquant"), compressors.DIANA)


def test_every_registered_compressor_runs_the_conformance_tests():
    """Edge cases (0-d, empty, integer inputs, every float dtype) live in the conformance
    class; a compressor registered without a conformance subclass would escape them."""
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.startswith("test_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    found, pending = set(), list(CompressorConformance.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__name__.startswith("Test"):
            found.add(cls().make().name)
    assert set(compressors.available()) <= found, set(compressors.available()) - found
