"""What the op library's build takes from this machine, besides the sources and nvcc.

* TensorFlow: its version, compile and link flags (``tf.sysconfig``) and the
  CUDA version it was built with (:func:`tensorflow_facts`), recorded per
  installation so that ``tfcompress --version`` computes the loader's cache
  key without importing TensorFlow;
* the C++ compiler (``$CXX``, default ``g++``) and its version line
  (:func:`compiler_version`);
* the system libraries the descriptions name (``system_libraries``): a domain
  whose library's header the compiler cannot find (a one-line preprocessor
  check) is left out of the build, alone (:func:`missing_libraries`, described
  by :class:`LeftOut`); ``TFCOMPRESS_OPS_WITHOUT=zlib`` treats a library as
  missing whether or not its header exists.

All of these are part of the cache key (:mod:`tfcompress.ops._configuration`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from tfcompress.ops import _cache, _description
from tfcompress.ops._build_errors import CompilerNotFoundError

__all__ = [
    "WITHOUT_ENV_VAR",
    "LeftOut",
    "TensorFlowFacts",
    "compiler_version",
    "extra_link_flags",
    "missing_libraries",
    "pretended_missing",
    "tensorflow_facts",
]

WITHOUT_ENV_VAR = "TFCOMPRESS_OPS_WITHOUT"
"""Names of system libraries to treat as missing (comma-separated), header or not."""

_COMPILER_HINT = (
    "install a C++17 compiler (apt-get install g++) or point $CXX at one; "
    "the next process builds the library"
)


# --- TensorFlow ---------------------------------------------------------------


@dataclass(frozen=True)
class TensorFlowFacts:
    """What the build and its cache key take from the installed TensorFlow.

    Attributes:
        version: ``tf.__version__``.
        compile_flags: ``tf.sysconfig.get_compile_flags()``.
        link_flags: ``tf.sysconfig.get_link_flags()``.
        cuda_version: the CUDA version TensorFlow was built with; None for a
            CPU-only TensorFlow.
    """

    version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    cuda_version: str | None  # None for a CPU-only TensorFlow


def tensorflow_facts(import_tensorflow: bool = True) -> TensorFlowFacts | None:
    """TensorFlow's version, flags and CUDA version, recorded per installation.

    With TensorFlow imported (or ``import_tensorflow``) they are read from it
    and recorded in the cache under a fingerprint of the installation (its
    folder, and the size and time of its ``__init__.py`` and framework
    library), so that a process that must not import TensorFlow
    (``tfcompress --version``: milliseconds, not seconds) still computes the
    loader's exact key. Returns None when TensorFlow is not imported,
    ``import_tensorflow`` is False and no record exists.
    """
    fingerprint = _tensorflow_fingerprint()
    record = _cache.cache_dir() / "ops" / "tensorflow" / f"{fingerprint}.json"
    if "tensorflow" not in sys.modules and not import_tensorflow:
        try:
            saved = json.loads(record.read_text())
            return TensorFlowFacts(
                version=saved["version"],
                compile_flags=tuple(saved["compile_flags"]),
                link_flags=tuple(saved["link_flags"]),
                cuda_version=saved["cuda_version"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
    import tensorflow as tf  # deferred: importing this module must stay cheap

    facts = TensorFlowFacts(
        version=tf.__version__,
        compile_flags=tuple(tf.sysconfig.get_compile_flags()),
        link_flags=tuple(tf.sysconfig.get_link_flags()),
        cuda_version=_tf_cuda_version(tf),
    )
    text = json.dumps(dataclasses.asdict(facts), indent=2) + "\n"
    with contextlib.suppress(OSError):  # a read-only cache only costs --version its speed
        if not record.is_file() or record.read_text() != text:
            record.parent.mkdir(parents=True, exist_ok=True)
            partial = record.with_name(f".{record.name}.{os.getpid()}.tmp")
            partial.write_text(text)
            os.replace(partial, record)
    return facts


def _tensorflow_fingerprint() -> str:
    """Names the installed TensorFlow without importing it (its folder and two files' stat)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return "none"
    folder = pathlib.Path(spec.origin).resolve().parent
    digest = hashlib.sha256()
    _cache.update_digest(digest, str(folder))
    for name in ("__init__.py", "libtensorflow_framework.so.2"):
        with contextlib.suppress(OSError):
            stat = (folder / name).stat()
            _cache.update_digest(digest, f"{name} {stat.st_size} {stat.st_mtime_ns}")
    return digest.hexdigest()[:24]


def _tf_cuda_version(tf) -> str | None:
    """The CUDA version TensorFlow was built with (``"12.5.1"``), or None for a CPU-only build."""
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build"):
        return None
    return str(info.get("cuda_version") or "")


# --- The C++ compiler ---------------------------------------------------------


def compiler_version(compiler: tuple[str, ...]) -> str:
    """Returns the first line of ``compiler --version`` (part of the cache key).

    Raises:
        CompilerNotFoundError: the compiler is empty, missing or does not run.
    """
    if not compiler:
        raise CompilerNotFoundError("tfcompress: $CXX is set but empty", hint=_COMPILER_HINT)
    if shutil.which(compiler[0]) is None:
        raise CompilerNotFoundError(
            f"tfcompress: C++ compiler {compiler[0]!r} not found "
            "(set $CXX to a C++17 compiler, e.g. CXX=g++)",
            hint=_COMPILER_HINT,
        )
    command = [*compiler, "--version"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerNotFoundError(
            f"tfcompress: cannot run C++ compiler {compiler[0]!r}: {error}",
            command=command,
            hint=_COMPILER_HINT,
        ) from error
    if result.returncode != 0:
        raise CompilerNotFoundError(
            f"tfcompress: {shlex.join(command)} failed with exit code {result.returncode}",
            stderr=result.stderr,
            command=command,
            hint=_COMPILER_HINT,
        )
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else ""


@functools.cache
def _header_found(compiler: tuple[str, ...], header: str) -> bool:
    """Whether ``#include <header>`` preprocesses: tens of milliseconds, once per process."""
    try:
        result = subprocess.run(
            [*compiler, "-E", "-x", "c++", "-", "-o", os.devnull],
            input=f"#include <{header}>\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


# --- System libraries ---------------------------------------------------------


@dataclass(frozen=True)
class LeftOut:
    """Domains a build leaves out because a system library is missing.

    Attributes:
        library: the system library, e.g. ``"zlib"``.
        header: the header that was looked for, e.g. ``"zlib.h"``.
        domains: the ``custom_ops/<domain>`` folders not compiled.
        what: the ops that lose their kernel, in words.
        reason: why the library counts as missing.
        install_hint: how to install it.
    """

    library: str
    header: str
    domains: tuple[str, ...]
    what: str
    reason: str
    install_hint: str

    def message(self) -> str:
        """One paragraph for users: what is missing, what it costs, the fix."""
        return (
            f"tfcompress: {self.what} runs its pure-TensorFlow reference (same results, "
            f"slower): the op library was built without {self.library} "
            f"(custom_ops/{', custom_ops/'.join(self.domains)} left out) because {self.reason}. "
            f"Fix: {self.install_hint}; the next process then builds the kernels with it "
            "(or run `tfcompress ops build` now)."
        )


def pretended_missing() -> set[str]:
    """The names in ``$TFCOMPRESS_OPS_WITHOUT`` (lower case)."""
    return {
        name.strip().lower()
        for name in os.environ.get(WITHOUT_ENV_VAR, "").split(",")
        if name.strip()
    }


def _system_libraries(
    descriptions: dict[str, _description.DomainDescription],
) -> list[tuple[_description.SystemLibrary, tuple[str, ...]]]:
    """Each system library some description names, with the domains that need it."""
    needed: dict[_description.SystemLibrary, list[str]] = {}
    for name, description in descriptions.items():
        for library in description.system_libraries:
            needed.setdefault(library, []).append(name)
    return [(library, tuple(domains)) for library, domains in needed.items()]


def extra_link_flags(
    domains: set[str] | None,
    missing: tuple[LeftOut, ...],
    descriptions: dict[str, _description.DomainDescription],
) -> tuple[str, ...]:
    """The link flags of every system library that some domain being built needs."""
    lacking = {item.library for item in missing}
    flags: list[str] = []
    for library, needing in _system_libraries(descriptions):
        needed = domains is None or bool(domains & set(needing))
        if needed and library.name not in lacking:
            flags.extend(library.linkopts)
    return tuple(flags)


def missing_libraries(
    compiler: tuple[str, ...],
    domains: set[str] | None,
    descriptions: dict[str, _description.DomainDescription],
) -> tuple[LeftOut, ...]:
    """The system libraries whose header the compiler cannot find, for the selected domains."""
    pretend = pretended_missing()
    missing = []
    for library, needing in _system_libraries(descriptions):
        if domains is not None and not domains & set(needing):
            continue
        install_hint = library.install_hint
        if library.name in pretend:
            reason = f"${WITHOUT_ENV_VAR} lists it"
            install_hint = (
                f"unset ${WITHOUT_ENV_VAR} (and if {library.name} is missing: {install_hint})"
            )
        elif not _header_found(compiler, library.header):
            reason = f"the compiler ({compiler[0]}) finds no <{library.header}>"
        else:
            continue
        missing.append(
            LeftOut(
                library=library.name,
                header=library.header,
                domains=needing,
                what=library.what,
                reason=reason,
                install_hint=install_hint,
            )
        )
    return tuple(missing)
