"""The errors of the op library's build (:mod:`tfcompress.ops._build`).

One module below every step of the build, so that the source lookup, the
toolchain checks, the compile and the loader raise and catch the same classes.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BuildError", "CompilerNotFoundError", "MissingLibraryError"]


class BuildError(RuntimeError):
    """The op library could not be built.

    Attributes:
        stderr: the compiler's complete standard error ("" when the compiler
            never ran).
        command: the command line that failed, or None.
        hint: what to do about it ("" when nothing specific helps).
        lasting: whether the same build would fail again (a compiler error),
            so that it is remembered; False when the compiler was killed.
    """

    def __init__(
        self,
        message: str,
        stderr: str = "",
        command: Sequence[str] | None = None,
        hint: str = "",
        lasting: bool = True,
    ):
        super().__init__(message)
        self.stderr = stderr
        self.command = list(command) if command is not None else None
        self.hint = hint
        self.lasting = lasting


class CompilerNotFoundError(BuildError):
    """The C++ compiler (``$CXX`` or ``g++``) does not exist or does not run."""


class MissingLibraryError(BuildError):
    """An op's kernel was left out of the library because a system library is missing."""
