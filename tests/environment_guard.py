"""A pytest plugin: no test may change the Python environment the suite runs in.

A test that installs or removes a distribution (``pip install --prefix``
uninstalls the running environment's copy of the same name first) breaks
whatever the user runs after the suite, e.g. the README's demo, while the
suite itself still passes from the checkout. The plugin records the installed
distributions (name, version, folder) when the session starts; after each
test it looks at the modification time of every site-packages folder (a
microsecond stat: installing or removing a distribution adds or deletes its
``*.dist-info`` there), compares the distributions again only when a folder
changed, and fails that test's teardown with what changed. A last full
comparison at the end of the session fails the run for a change no folder
time showed.
"""

from __future__ import annotations

import importlib.metadata
import os
import site

import pytest


def site_folders() -> list[str]:
    """The folders distributions are installed into for this interpreter."""
    folders = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.add(site.getusersitepackages())
    return sorted(folders)


def installed() -> set[tuple[str, str, str]]:
    """Every installed distribution as (normalised name, version, folder)."""
    found = set()
    for distribution in importlib.metadata.distributions():
        name = (distribution.metadata["Name"] or "?").lower().replace("_", "-")
        folder = str(distribution.locate_file(""))
        found.add((name, distribution.version, folder))
    return found


def _stamps() -> tuple[tuple[str, int | None], ...]:
    stamps = []
    for folder in site_folders():
        try:
            stamps.append((folder, os.stat(folder).st_mtime_ns))
        except OSError:
            stamps.append((folder, None))
    return tuple(stamps)


def describe(before: set, after: set) -> str:
    """What was added, removed or changed between two :func:`installed` sets."""
    lines = [f"removed {name} {version} ({folder})" for name, version, folder in before - after]
    lines += [f"added {name} {version} ({folder})" for name, version, folder in after - before]
    return "; ".join(sorted(lines))


class EnvironmentGuard:
    """Holds the session's record; registered by :func:`pytest_configure`."""

    def __init__(self) -> None:
        self.baseline = installed()
        self.stamps = _stamps()
        self.reported = False

    def changes(self) -> str:
        """What differs from the session's start ("" when nothing)."""
        current = installed()
        return describe(self.baseline, current) if current != self.baseline else ""

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        """Fails the teardown of the first test after which a distribution changed."""
        outcome = yield
        stamps = _stamps()
        if stamps == self.stamps or self.reported:
            return
        self.stamps = stamps
        changed = self.changes()
        if changed and outcome.excinfo is None:
            self.reported = True  # one test is named; later tests are not blamed for it
            outcome.force_exception(
                pytest.fail.Exception(
                    f"{item.nodeid} changed the Python environment the tests run in "
                    f"(tests must never install or remove packages): {changed}",
                    pytrace=False,
                )
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Fails the run for a change no test was named for."""
        changed = self.changes()
        if changed and not self.reported:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = f"the test session changed the Python environment: {changed}"
            if reporter is not None:
                reporter.write_line(message, red=True)


def pytest_configure(config: pytest.Config) -> None:
    """Registers the guard, recording the environment as the session starts."""
    config.pluginmanager.register(EnvironmentGuard(), "tfcompress-environment-guard")
