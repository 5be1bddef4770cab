"""The command-line number and rate types shared by ``tfcompress launch`` and the benchmarks."""

import argparse

import pytest

from tfcompress.launch import arguments


@pytest.mark.parametrize(
    "convert, text, expected",
    [
        (arguments.positive_int, "3", 3),
        (arguments.non_negative_int, "0", 0),
        (arguments.positive_float, "0.5", 0.5),
        (arguments.non_negative_float, "0", 0.0),
        (arguments.milliseconds, "2.5", 2.5),
        (arguments.port, "65535", 65535),
        (arguments.link_rate, "100mbit", "100mbit"),
    ],
)
def test_valid_values_convert(convert, text, expected):
    assert convert(text) == expected


@pytest.mark.parametrize(
    "convert, text, message",
    [
        (arguments.positive_int, "0", "must be an integer >= 1, got 0"),
        (arguments.positive_int, "two", "must be an integer, got 'two'"),
        (arguments.non_negative_int, "-1", "must be an integer >= 0, got -1"),
        (arguments.positive_float, "nan", "must be a number > 0, got nan"),
        (arguments.positive_float, "inf", "must be a number > 0, got inf"),
        (arguments.non_negative_float, "-0.1", "must be a number >= 0, got -0.1"),
        (arguments.non_negative_float, "x", "must be a number, got 'x'"),
        (arguments.milliseconds, "-3", "must be a number of milliseconds >= 0, got -3"),
        (arguments.port, "0", "must be a port in [1, 65535], got 0"),
        (arguments.port, "70000", "must be a port in [1, 65535], got 70000"),
        (arguments.link_rate, "fast", "must be a rate"),
    ],
)
def test_bad_values_say_what_is_expected(convert, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[")):
        convert(text)
