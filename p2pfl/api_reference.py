"""docs/api.md's reference, from the public names' own signatures and docstrings (p2pfl.__all__):
`python -m p2pfl.docs docs/api.md` rewrites it, and a test keeps it current."""

from __future__ import annotations

import dataclasses
import inspect
import re

import p2pfl

FIELD_COMMENT = re.compile(r"^    (\w+):[^#\n]*#\s*(.+)$", re.M)


def own_doc(obj) -> str | None:
    """obj's own docstring: not inherited, and not the signature a dataclass writes for itself."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not doc or (dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}(")):
        return None
    return inspect.cleandoc(doc)


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _fields(cls) -> list[str]:
    """A dataclass's fields: name, type, default and the comment its source line carries."""
    try:
        comments = dict(FIELD_COMMENT.findall(inspect.getsource(cls)))
    except OSError:  # a class made from declarations (GossipSettings, from the codec registry) has no source
        comments = {}
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory.__name__}()`"
        else:
            default = "required"
        meaning = comments.get(f.name) or f.metadata.get("help", "")
        rows.append(f"| `{f.name}` | `{_cell(f.type)}` | {default} | {_cell(meaning)} |")
    return rows


def _members(cls) -> list[str]:
    """The public methods and properties the class itself defines, each with its docstring's first
    paragraph."""
    lines = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") or inspect.isclass(member):
            continue
        if isinstance(member, property) or hasattr(member, "attrname"):  # a property, a cached one
            target, shown = getattr(member, "fget", None) or member.func, name
        elif isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            target = getattr(cls, name)  # bound where it is a classmethod: no cls in its signature
            shown = f"{name}{_signature(target)}".replace("(self, ", "(").replace("(self)", "()")
        else:
            continue
        doc = inspect.getdoc(target) or ""
        lines.append(f"- `{shown}`" + (f": {_cell(doc.split(chr(10) * 2)[0])}" if doc else ""))
    return lines


def entry(name: str) -> list[str]:
    obj = getattr(p2pfl, name)
    doc = own_doc(obj) or ""
    if inspect.isclass(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
        lines = [f"### `{name}`", "", f"`class {name}{f'({bases})' if bases else ''}`", "", doc, ""]
        if dataclasses.is_dataclass(obj):
            lines += [*_fields(obj), ""]
        members = _members(obj)
        if members:
            lines += ["Methods and properties:", "", *members, ""]
        return lines
    return [f"### `{name}`", "", f"`{name}{_signature(obj)}`", "", doc, ""]


def reference() -> str:
    lines = [f"p2pfl {p2pfl.__version__}: every name `import p2pfl` gives, in alphabetical order.", ""]
    for name in p2pfl.__all__:
        lines += entry(name)
    return "\n".join(lines).rstrip()
