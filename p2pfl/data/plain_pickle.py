"""Pickles that hold only data (dicts, lists, bytes, numpy arrays), read without running code: the
unpickler resolves no name but numpy's array constructors (and the bytes codec of Python 2 pickles), so
a file that names anything else is refused before it is built. CIFAR's python version and the NTK-FL /
NTK-DFL reference codes' partition files are read this way."""
from __future__ import annotations

import importlib
import pickle

ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
           ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class RefusedName(pickle.UnpicklingError):
    """The pickle names something that is not plain data (its 'module.name' is the message)."""


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise RefusedName(f"{module}.{name}")
        if module.startswith("numpy.core"):  # numpy 2 moved numpy.core to numpy._core
            module = module.replace("numpy.core", "numpy._core")
        return getattr(importlib.import_module(module), name)
