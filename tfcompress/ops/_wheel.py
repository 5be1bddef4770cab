"""Fills a platform wheel's ``tfcompress/ops/_prebuilt/`` folder (setup.py runs this).

``python -m tfcompress.ops._wheel DESTINATION`` builds the op library for the
installed TensorFlow with :func:`tfcompress.ops._build.build` (so an already
cached library is reused, not compiled again) and copies it, its
``build_info.json`` and the record of what it was built for
(:mod:`tfcompress.ops._prebuilt`) into ``DESTINATION``. setup.py runs it in a
child process, with the checkout on ``PYTHONPATH``, so that TensorFlow is
never imported by setup.py itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import sys

from tfcompress.ops import _build, _cache, _configuration, _prebuilt, _sources, _toolchain

__all__ = ["stage"]


def stage(destination: pathlib.Path) -> pathlib.Path:
    """Builds the op library for the installed TensorFlow (or reuses the cached one) and
    copies it, its ``build_info.json`` and its record (``prebuilt.json``) into ``destination``.

    setup.py calls this, in a child process, when it builds a platform wheel.

    Args:
        destination: the folder to fill (created; its old files are replaced).

    Returns:
        The staged library.

    Raises:
        BuildError: the library cannot be built.
    """
    facts = _toolchain.tensorflow_facts()
    config = _configuration.configure(facts)
    library = _build.build()
    info = json.loads((library.parent / "build_info.json").read_text())
    descriptions = _sources.descriptions(config.root).values()
    libraries = {needed.name for d in descriptions for needed in d.system_libraries}
    built_with = sorted(libraries - {item.library for item in config.left_out})
    if config.gpu.domains:
        built_with.append("cuda")
        if any(flag.startswith("-Wl,-rpath,") for flag in config.gpu.link_flags):
            print(
                "tfcompress: warning: the staged library finds the CUDA runtime through a folder "
                f"of this machine ({' '.join(config.gpu.link_flags)}); installs elsewhere need "
                "nvidia-cuda-runtime-cu12 at the same path, or a toolkit with libcudart_static.a",
                file=sys.stderr,
            )
    record = {
        "format": _prebuilt.RECORD_FORMAT,
        **dataclasses.asdict(_prebuilt.compatibility(facts, config.sources_digest)),
        "built_with": built_with,
        "cache_key": config.key,
        "compiler": config.compiler_version,
    }
    if os.path.exists(destination):
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    shutil.copy2(library, destination / _cache.LIBRARY_NAME)
    (destination / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    (destination / _prebuilt.RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    return destination / _cache.LIBRARY_NAME


if __name__ == "__main__":  # setup.py: python -m tfcompress.ops._wheel DESTINATION
    staged = stage(pathlib.Path(sys.argv[1]))
    print(staged)
    print(f"tfcompress: the wheel carries {_prebuilt.find(staged.parent).summary}", file=sys.stderr)
