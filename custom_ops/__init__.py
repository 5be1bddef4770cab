"""The C++ sources of the tfcompress ops, installed as package data of ``tfcompress._custom_ops``.

The repository keeps them at the top level (``custom_ops/<domain>/cc/{ops,kernels}``,
each domain's build stated in ``custom_ops/<domain>/description.bzl``);
setup.py maps this directory to the package ``tfcompress._custom_ops`` so that
every install (a wheel in any prefix, ``pip install --user``, an editable
install) carries them, and :func:`tfcompress.ops._sources.source_root` finds
them with :mod:`importlib.resources`. Nothing here is Python code to import.
"""
