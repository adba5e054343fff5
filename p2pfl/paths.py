"""Output paths checked before any work: one line for a path no file system would take, not a traceback
halfway through a run."""
from __future__ import annotations

from pathlib import Path

from p2pfl.errors import UserError

NAME_MAX = 255  # the longest file or folder name most file systems take
PATH_MAX = 4000  # under Linux's 4,096 bytes, with room for the names a run writes inside


def checked_path(path: Path, what: str) -> Path:
    """A path that can be made: not too long, no name over 255 characters, no file or dangling link on
    the way."""
    text = str(path)
    if len(text) > PATH_MAX:
        raise UserError(f"{what} is {len(text):,} characters long; use a shorter path")
    long = [part for part in Path(path).parts if len(part) > NAME_MAX]
    if long:
        raise UserError(f"{what} has a name of {len(long[0])} characters ({long[0][:20]}...); at most {NAME_MAX}")
    for parent in [Path(path), *Path(path).parents]:
        if parent.is_symlink() and not parent.exists():
            raise UserError(f"{what}: {parent} is a link to nothing")
        if parent != Path(path) and parent.exists() and not parent.is_dir():
            raise UserError(f"{what} cannot be made: {parent} is a file, not a folder")
    return Path(path)
