"""The documentation holds together: a short README, an index, links that resolve, a reference that builds.

The API reference is built in this process by ``scripts/build_docs.py`` (the
program of ``scripts/build_docs.sh``), with TensorFlow already imported, so it
takes seconds; it is skipped where pdoc is not installed (``scripts/setup.sh``
installs it with the ``dev`` extra, as CI does).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 200

#: The README's two commands, as .ci/run and users type them.
DEMO_COMMAND = "./scripts/setup.sh && python examples/fashion_mnist/demo.py"
TEST_COMMAND = (
    "./scripts/setup.sh && ruff check . && ruff format --check . && "
    'python -m pytest -q -m "not slow" -n 2 --dist loadfile && python -m pytest -q -m slow'
)

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    """README, TESTING, CHANGELOG and every page under docs/."""
    top = [ROOT / name for name in ("README.md", "TESTING.md", "CHANGELOG.md")]
    return [p for p in top if p.exists()] + sorted(DOCS.rglob("*.md"))


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (their brackets are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(path: Path) -> list[str]:
    return _LINK.findall(prose(path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def local_target(source: Path, target: str) -> tuple[Path, str] | None:
    """The file and anchor a relative link points to (``None``: a URL or a mail address)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None
    file_part, _, anchor = target.partition("#")
    return (source if not file_part else (source.parent / file_part).resolve()), anchor


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_keeps_its_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert DEMO_COMMAND in readme
    assert TEST_COMMAND in readme
    # CI runs "the README's test command": the same line, ended by `|| exit 1` (under
    # `set -e` a failed step of an && list that is not its last one would not stop it).
    assert TEST_COMMAND + " || exit 1\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_docs_index_exists_and_links_the_pages():
    index = DOCS / "index.md"
    assert index.is_file()
    assert "docs/index.md" in links(ROOT / "README.md")
    # Every page is reachable from the index (benchmark runs' generated tables aside).
    pages = {
        p.resolve()
        for p in DOCS.rglob("*.md")
        if not p.is_relative_to(DOCS / "bench") or p.name == "NOTES.md"
    }
    seen, todo = set(), [index.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        for target in links(page):
            resolved = local_target(page, target)
            if resolved is not None:
                todo.append(resolved[0])
    unreachable = sorted(str(p.relative_to(ROOT)) for p in pages - seen)
    assert not unreachable, (
        f"pages not linked from docs/index.md (or a page it links): {unreachable}"
    )


def test_relative_links_resolve():
    broken = []
    for path in markdown_files():
        for target in links(path):
            resolved = local_target(path, target)
            if resolved is None:
                continue
            file, anchor = resolved
            where = f"{path.relative_to(ROOT)}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_checker_sees_links_and_skips_code():
    assert slug("7. Aggregation paths: buckets, packs, two stages") == (
        "7-aggregation-paths-buckets-packs-two-stages"
    )
    assert slug("The `aggregation=` option") == "the-aggregation-option"
    assert slug("On your own cluster (`--cluster tf_config`)") == (
        "on-your-own-cluster---cluster-tf_config"
    )
    text = "[a](x.md#y) `[b](not.md)` ![c](img.png)\n```\n[d](code.md)\n```\n<http://e>"
    assert _LINK.findall(prose(text)) == ["x.md#y", "img.png"]


def _build_docs_module():
    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_builds(tmp_path):
    pytest.importorskip("pdoc")
    build_docs = _build_docs_module()
    problems = build_docs.build(tmp_path / "api")
    assert problems == []
    pages = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*.html")}
    assert {"tfcompress.html", "tfcompress/compressors.html", "tfcompress/distribute.html"} <= pages
    compressors = (tmp_path / "api" / "tfcompress" / "compressors.html").read_text(encoding="utf-8")
    assert "QSGD" in compressors and "Alistarh" in compressors  # the class and its docstring


def test_api_reference_build_fails_on_a_broken_module(tmp_path):
    pytest.importorskip("pdoc")
    package = tmp_path / "src" / "brokendocs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""A package whose submodule does not import."""\n__all__ = ["broken"]\n'
    )
    (package / "broken.py").write_text('"""Broken."""\nimport no_such_module_of_tfcompress_docs\n')
    program = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.path.insert(0, {str(tmp_path / "src")!r})
        spec = importlib.util.spec_from_file_location("build_docs", {str(ROOT / "scripts" / "build_docs.py")!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.MODULES = ("brokendocs",)
        print(module.build({str(tmp_path / "out")!r}))
        """
    )
    # A fresh process: pdoc would otherwise keep the broken package in this one's sys.modules.
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "Error importing brokendocs.broken" in out
