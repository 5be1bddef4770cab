"""The op library a platform wheel carries, and when the loader may use it.

A wheel built where TensorFlow and a compiler are installed (``pip wheel .
--no-build-isolation``, see setup.py) carries the compiled library beside the
sources, in ``tfcompress/ops/_prebuilt/``::

    libtfcompress_ops.so   the library (CPU kernels; GPU kernels when the
                           build found its CUDA route)
    build_info.json        what was compiled (as in a cache key directory)
    prebuilt.json          what it was built for (:class:`Compatibility`)

A process uses it, without compiling and without a compiler, when it was
built for the same TensorFlow version, with the same TensorFlow ABI flags (the
compile and link flags less the folders, which differ from one environment to
the next) and from the same sources (the digest of the installed
``custom_ops``), and nothing asks for another build
(``TFCOMPRESS_OPS_DOMAINS``, or ``TFCOMPRESS_OPS_WITHOUT`` naming something
the library was built with). :func:`mismatch` says in one line why it does not
fit; the loader then compiles into the cache as without a wheel
(:func:`tfcompress.ops._build.library_for_process`). setup.py fills the folder
with :mod:`tfcompress.ops._wheel`.

A library built into the cache for this process's exact configuration wins
over the prebuilt one: ``tfcompress ops build`` on a machine with a CUDA 12
route gives it the GPU kernels a CPU-only wheel lacks.
"""

from __future__ import annotations

import json
import pathlib
import sys
from dataclasses import dataclass

from tfcompress.ops import _cache, _sources, _toolchain

__all__ = [
    "PREBUILT_DIR",
    "RECORD_FORMAT",
    "RECORD_NAME",
    "Compatibility",
    "Prebuilt",
    "compatibility",
    "find",
]

PREBUILT_DIR = pathlib.Path(__file__).resolve().parent / "_prebuilt"
"""Where an installed wheel keeps its prebuilt library (absent from a checkout)."""

RECORD_NAME = "prebuilt.json"
"""The file, beside the prebuilt library, that says what it was built for."""

RECORD_FORMAT = 1
"""The version of :data:`RECORD_NAME`'s layout."""

# Flags that name folders of one installation: the same TensorFlow installed in
# another environment has other ones, and the same ABI.
_FOLDER_FLAGS = ("-I", "-L", "-isystem", "-Wl,-rpath")


@dataclass(frozen=True)
class Compatibility:
    """What a prebuilt library and the process that loads it must share.

    Attributes:
        tensorflow: TensorFlow's version, e.g. ``"2.21.0"``.
        abi_flags: TensorFlow's compile and link flags without the folders
            (``-D_GLIBCXX_USE_CXX11_ABI=1``, ``-l:libtensorflow_framework.so.2``, ...).
        sources_sha256: the digest of the C++ sources and descriptions.
    """

    tensorflow: str
    abi_flags: tuple[str, ...]
    sources_sha256: str


def compatibility(
    facts: _toolchain.TensorFlowFacts, sources_sha256: str | None = None
) -> Compatibility:
    """Returns what a library built or loaded with this TensorFlow and these sources needs.

    Args:
        facts: the installed TensorFlow's (:func:`tfcompress.ops._toolchain.tensorflow_facts`).
        sources_sha256: the sources' digest; the installed sources' when None.

    Raises:
        BuildError: the sources are missing.
    """
    flags = (*facts.compile_flags, *facts.link_flags)
    return Compatibility(
        tensorflow=facts.version,
        abi_flags=tuple(f for f in flags if not f.startswith(_FOLDER_FLAGS)),
        sources_sha256=_sources.sources_digest() if sources_sha256 is None else sources_sha256,
    )


@dataclass(frozen=True)
class Prebuilt:
    """A prebuilt library found in the package.

    Attributes:
        library: the library file.
        built_for: what it was built for.
        summary: what it holds, in one line (its build's summary).
        built_with: the optional parts it has (``"zlib"``, ``"cuda"``), which
            ``TFCOMPRESS_OPS_WITHOUT`` may ask to leave out.
    """

    library: pathlib.Path
    built_for: Compatibility
    summary: str
    built_with: tuple[str, ...]

    def mismatch(self, current: Compatibility) -> str | None:
        """Says why this library does not fit the current process, or None when it does.

        Args:
            current: :func:`compatibility` of the current process.
        """
        built = self.built_for
        if built.tensorflow != current.tensorflow:
            return (
                f"it was built for TensorFlow {built.tensorflow}, "
                f"and TensorFlow {current.tensorflow} is installed"
            )
        if built.abi_flags != current.abi_flags:
            return (
                f"TensorFlow's flags differ from those it was built with "
                f"({' '.join(built.abi_flags)} there, {' '.join(current.abi_flags)} here)"
            )
        if built.sources_sha256 != current.sources_sha256:
            return (
                f"the C++ sources under {_sources.source_root()} are not those it was built "
                f"from (digest {current.sources_sha256[:12]}, built from {built.sources_sha256[:12]})"
            )
        if _sources.selected_domains() is not None:
            return "$TFCOMPRESS_OPS_DOMAINS selects a build of some domains only"
        unwanted = sorted(_toolchain.pretended_missing() & set(self.built_with))
        if unwanted:
            return (
                f"${_toolchain.WITHOUT_ENV_VAR} asks for a build without {', '.join(unwanted)}, "
                "which it has"
            )
        return None


def find(folder: pathlib.Path | None = None) -> Prebuilt | None:
    """Returns the package's prebuilt library, or None when the install has none.

    Args:
        folder: where to look; :data:`PREBUILT_DIR` when None.

    Returns:
        None also when the folder is incomplete or its record unreadable
        (with one warning on stderr: such a wheel is broken).
    """
    folder = PREBUILT_DIR if folder is None else folder
    library = folder / _cache.LIBRARY_NAME
    if not library.is_file():
        return None
    try:
        record = json.loads((folder / RECORD_NAME).read_text())
        info = json.loads((folder / "build_info.json").read_text())
        if record.get("format") != RECORD_FORMAT:
            raise ValueError(f"record format {record.get('format')!r}")
        built_for = Compatibility(
            tensorflow=record["tensorflow"],
            abi_flags=tuple(record["abi_flags"]),
            sources_sha256=record["sources_sha256"],
        )
        built_with = tuple(record["built_with"])
        summary = str(info.get("summary", ""))
    except (OSError, ValueError, TypeError, KeyError) as error:
        print(
            f"tfcompress: ignoring the prebuilt op library {library}: its record "
            f"({folder / RECORD_NAME}, build_info.json) cannot be read ({error})",
            file=sys.stderr,
        )
        return None
    return Prebuilt(library=library, built_for=built_for, summary=summary, built_with=built_with)
