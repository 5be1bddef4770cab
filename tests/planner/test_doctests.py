"""The examples in the planner's docstrings run."""

import doctest

import pytest

from tfcompress.planner import (
    advice,
    alpha_beta,
    autoplan,
    calibration,
    candidates,
    cost,
    link,
    paths,
)


@pytest.mark.parametrize(
    "module",
    [advice, alpha_beta, autoplan, calibration, candidates, cost, link, paths],
    ids=lambda m: m.__name__,
)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert failures == 0
    if module not in (advice,):
        assert tried > 0
