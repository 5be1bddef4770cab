import pytest

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
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bits'\].*\['dtype'\]"):
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
