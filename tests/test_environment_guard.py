"""The environment guard fails the test that installs or removes a package, by name.

An inner pytest session (pytester) runs with the guard and a site folder of
its own (added with :func:`site.addsitedir`, so :mod:`importlib.metadata`
sees it): a test that writes a distribution there, or deletes one, is
reported. Nothing outside ``tmp_path`` is touched.
"""

from __future__ import annotations

import pathlib

import pytest

REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[1])

pytest_plugins = ["pytester"]

INNER_CONFTEST = """
import pathlib, site, sys
sys.path.insert(0, {repo!r})
from tests import environment_guard

FOLDER = pathlib.Path({folder!r})
site.addsitedir(str(FOLDER))
environment_guard.site_folders = lambda: [str(FOLDER)]
pytest_plugins = ["tests.environment_guard"]
"""

INNER_TESTS = """
import pathlib, shutil
from conftest import FOLDER

def test_harmless():
    assert True

def test_{action}_a_package():
    if "{action}" == "installs":
        info = FOLDER / "surprise-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\\nName: surprise\\nVersion: 1.0\\n")
    else:
        shutil.rmtree(FOLDER / "resident-2.0.dist-info")

def test_after():
    assert True
"""


@pytest.mark.parametrize("action", ["installs", "removes"])
def test_the_guard_names_the_test_that_changed_the_environment(pytester, tmp_path, action):
    folder = tmp_path / "site-packages"
    resident = folder / "resident-2.0.dist-info"
    resident.mkdir(parents=True)
    (resident / "METADATA").write_text("Metadata-Version: 2.1\nName: resident\nVersion: 2.0\n")
    pytester.makeconftest(INNER_CONFTEST.format(folder=str(folder), repo=REPO_ROOT))
    pytester.makepyfile(test_inner=INNER_TESTS.format(action=action))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    output = result.stdout.str()
    assert f"test_inner.py::test_{action}_a_package changed the Python environment" in output
    expected = "added surprise 1.0" if action == "installs" else "removed resident 2.0"
    assert expected in output
    assert "ERROR at teardown of test_after" not in output


def test_a_session_that_changes_nothing_passes(pytester, tmp_path):
    folder = tmp_path / "site-packages"
    folder.mkdir()
    pytester.makeconftest(INNER_CONFTEST.format(folder=str(folder), repo=REPO_ROOT))
    pytester.makepyfile(test_inner="def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
