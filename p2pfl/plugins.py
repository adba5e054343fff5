"""Code of the user's own, named where a built-in name would go: 'package.module:attribute' (on the
Python path) for an algorithm, a model or a dataset; installed packages may also register algorithms
through the 'p2pfl.algorithms' entry-point group. Calling such code (call_plugin, an algorithm's hooks by
call_hook) makes its failure one line and its own frames."""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from importlib.metadata import entry_points

from p2pfl.errors import UserError

ENTRY_POINTS = "p2pfl.algorithms"


def is_reference(name: str) -> bool:
    """Whether a name is a 'module:attribute' reference rather than a built-in name."""
    return ":" in str(name)


GIVEN: dict[str, object] = {}  # objects handed to p2pfl.simulate by value, by the reference that names them


def reference_to(obj) -> str:
    """The 'module:qualname' reference of a function or class given by value (simulate(topology=f)), kept
    so that load_object finds it even where its module cannot be imported (a notebook's __main__, a
    function defined inside another). A second object of the same name gets its id appended."""
    name = f"{getattr(obj, '__module__', None) or '__main__'}:{getattr(obj, '__qualname__', type(obj).__name__)}"
    if GIVEN.get(name, obj) is not obj:
        name = f"{name}#{id(obj)}"
    GIVEN[name] = obj
    return name


def load_object(reference: str, flag: str):
    """The object a 'package.module:attribute' reference names, or one UserError line saying why not."""
    if reference in GIVEN:
        return GIVEN[reference]
    module_name, _, attribute = str(reference).partition(":")
    if not module_name or not attribute:
        raise UserError(f"{flag} {reference}: a reference reads package.module:name")
    target = call_plugin(f"{flag} {reference} (importing {module_name})", _import, module_name, flag, reference)
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserError(f"{flag} {reference}: {module_name} has no {attribute}")
        target = getattr(target, part)
    return target


def _import(module_name: str, flag: str, reference: str):
    """The module; one that is not there at all is ours to say, an error inside it (their syntax, a module
    their code imports) is theirs (call_plugin)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UserError(
                f"{flag} {reference}: cannot import {module_name} ({exc}); is its folder on PYTHONPATH?"
            ) from None
        raise


def check_signature(where: str, function, *parameters: str) -> None:
    """One line where the user's function cannot be called with the arguments p2pfl passes (a TypeError
    from inside it would look like a bug of theirs, or of ours)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a built-in or C function shows none: its call says
        return
    try:
        signature.bind(*parameters)
    except TypeError:
        name = getattr(function, "__name__", type(function).__name__)
        signature = signature.replace(return_annotation=inspect.Signature.empty)
        raise UserError(
            f"{where}: {name}{signature} cannot be called as {name}({', '.join(parameters)}); write it to take "
            f"those {len(parameters)} arguments"
        ) from None


def call_plugin(what: str, function, *args):
    """function(*args), the user's own code. Where it raises: one UserError whose first line says which
    plug-in failed doing what, followed by the user's frames only (p2pfl's are not theirs to read)."""
    try:
        return function(*args)
    except UserError:
        raise
    except SystemExit as exc:  # their sys.exit would end the run silently, even with status 0
        raise UserError(
            f"{what} called sys.exit({exc.code!r}); a plug-in returns, or raises an exception that says why"
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is theirs to see
        raise _theirs(what, exc) from None


def load_function(reference: str, flag: str, *parameters: str):
    """A user's function by package.module:name, checked where it enters: callable, and callable with the
    arguments p2pfl passes (named by parameters)."""
    function = load_object(reference, flag)
    where = f"{flag} {reference}"
    if not callable(function):
        raise UserError(f"{where} is {type(function).__name__}; it names a function({', '.join(parameters)})")
    check_signature(where, function, *parameters)
    return function


def is_ours(code) -> bool:
    """Whether a class or function is p2pfl's own (its errors are p2pfl's bugs: a full traceback)."""
    return getattr(code, "__module__", "").startswith("p2pfl.")


def call_hook(algorithm, hook: str, *args):
    """algorithm.hook(*args) (a class or an instance; "__init__" builds one). p2pfl's own algorithms are
    called as they are (their errors are p2pfl's bugs: a full traceback); a user's through call_plugin,
    so its exception or sys.exit is one line naming the algorithm and the hook, then its frames."""
    cls = algorithm if isinstance(algorithm, type) else type(algorithm)
    method = cls if hook == "__init__" else getattr(algorithm, hook)
    if is_ours(cls):
        return method(*args)
    return call_plugin(f"--algo {cls.name}: its {hook}", method, *args)


def _theirs(what: str, exc: Exception) -> UserError:
    """The user's exception as one line, then the frames from their code on (importlib's and p2pfl's left
    out)."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename.startswith("<frozen importlib")
        or tb.tb_frame.f_code.co_filename in (importlib.__file__, __file__)
    ):
        tb = tb.tb_next
    frames = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
    return UserError(f"{what} raised {type(exc).__name__}; its traceback:\n{frames}")


def load_entry_points() -> None:
    """Import the algorithms installed packages register (each registers itself when its class is
    defined); one that fails to load is named on stderr and left out."""
    for point in entry_points(group=ENTRY_POINTS):
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001 - someone else's package must not stop every run
            print(
                f"p2pfl: the algorithm {point.name} ({point.value}) of an installed package did not load: "
                f"{exc.__class__.__name__}: {exc}",
                file=sys.stderr,
            )
