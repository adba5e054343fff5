"""Pickles that hold only data (dicts, lists, bytes, numpy arrays), read without running code: the
unpickler resolves no name but numpy's array constructors (and the bytes codec of Python 2 pickles), so
a file that names anything else is refused before it is built. CIFAR's python version and the NTK-FL /
NTK-DFL reference codes' partition files are read this way."""

from __future__ import annotations

import importlib
import pickle

import numpy as np

ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
    # protocol 5 (numpy 2's pickles): an array rebuilt from its bytes
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class RefusedName(pickle.UnpicklingError):
    """The pickle names something that is not plain data (its 'module.name' is the message)."""


def _bytes(*args) -> bytes:
    """bytes() as a Python 2 pickle of an empty array calls it, but never bytes(n): n zero bytes from a
    number in the file would be a way to ask for any amount of memory."""
    if args and not isinstance(args[0], (bytes, bytearray, str)):
        raise pickle.UnpicklingError("bytes() of a number")
    return bytes(*args)


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in (("__builtin__", "bytes"), ("builtins", "bytes")):
            return _bytes
        if (module, name) not in ALLOWED:
            raise RefusedName(f"{module}.{name}")
        if module.startswith("numpy.core"):  # numpy 2 moved numpy.core to numpy._core
            module = module.replace("numpy.core", "numpy._core")
        return getattr(importlib.import_module(module), name)


def integers(value) -> np.ndarray | None:
    """value as a 1-D int64 array, or None where it is not a flat list or array of integers. Checked
    element by element before any array is built: a small pickle of nested lists that share their parts
    stands for billions of entries (a pickle bomb), and building an array of it would never end."""
    if isinstance(value, np.ndarray):
        ok = value.ndim == 1 and np.issubdtype(value.dtype, np.integer)
        return value.astype(np.int64) if ok else None
    if isinstance(value, (list, tuple)) and all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in value
    ):
        try:
            return np.asarray(value, dtype=np.int64)
        except OverflowError:
            return None
    return None
