"""Paths checked before any work: one line for a path no file system would take, not a traceback halfway
through a run; files read only where they are regular files; a run folder to resume without links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from p2pfl.errors import UserError

NAME_MAX = 255  # the longest file or folder name most file systems take
LOCK_NAME = ".p2pfl-lock"  # the run folder's lock file (run_folder.FolderLock)
PROBE_PREFIX = ".p2pfl-write-test-"  # a rank's throwaway folder that tries whether --out can be written
PATH_MAX = 4000  # under Linux's 4,096 bytes, with room for the names a run writes inside


def checked_path(path: Path, what: str) -> Path:
    """A path that can be made: not too long, no name over 255 characters, no file or dangling link on
    the way."""
    text = str(path)
    if len(os.fsencode(text)) > PATH_MAX:  # the limits are in bytes: an accented letter takes two in UTF-8
        raise UserError(f"{what} is {len(text):,} characters long; use a shorter path")
    long = [part for part in Path(path).parts if len(os.fsencode(part)) > NAME_MAX]
    if long:
        size = len(os.fsencode(long[0]))
        raise UserError(
            f"{what} has a name of {len(long[0])} characters ({long[0][:20]}...)"
            f"{f', {size} bytes' if size != len(long[0]) else ''}; at most {NAME_MAX} bytes"
        )
    for parent in [Path(path), *Path(path).parents]:
        if parent.is_symlink() and not parent.exists():
            raise UserError(f"{what}: {parent} is a link to nothing")
        if parent != Path(path) and parent.exists() and not parent.is_dir():
            raise UserError(f"{what} cannot be made: {parent} is a file, not a folder")
    return Path(path)


def resolved(path: str, flag: str) -> str:
    """An input file's absolute path (a resumed run reads the same file), or one line where its links loop."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError) as exc:  # Python raises RuntimeError for a loop of links
        raise UserError(f"{flag} {path} cannot be found ({getattr(exc, 'strerror', None) or exc})")


SMALL_FILE = 1 << 20  # a config file or latest.json is a few kB


def read_regular(path: Path, limit: int | None = SMALL_FILE) -> bytes:
    """The bytes of a regular file (a link to one is followed) of at most `limit` bytes: a named pipe, a
    device (/dev/zero) or a huge file would block the run or fill its memory. OSError where it is not."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file")
    if limit is not None and info.st_size > limit:
        raise OSError(f"{path} holds {info.st_size:,} bytes, more than a {limit:,}-byte file of its kind")
    with open(path, "rb") as fh:
        return fh.read(limit + 1 if limit is not None else -1)


def refuse_link(path: Path, folder: Path, flag: str) -> None:
    """One line where a file the run would write is a link: a run writes only inside its folder."""
    if path.is_symlink():
        raise UserError(
            f"{flag}: {path.relative_to(folder)} is a link; a run writes only inside its "
            "folder, never through a link (replace it with the file, or remove it)"
        )


def refuse_shared(path: Path, folder: Path, flag: str) -> None:
    """One line where a file a resume would append to or rewrite has a second name (a hard link): written
    through, the other name would change too. (--overwrite removes a run's files first: no link is kept.)"""
    if path.is_file() and path.stat().st_nlink > 1:
        raise UserError(
            f"{flag}: {path.relative_to(folder)} has another name (a hard link, {path.stat().st_nlink} names in "
            "all); a run writes only inside its folder, never into a file shared with elsewhere (copy it, or "
            "remove the other name)"
        )


def check_resumable(run_dir: Path, checkpoints: str) -> None:
    """Before a resume writes anything: no link among the run folder's files (a run writes only inside its
    folder, never through a link to elsewhere), and the checkpoint folder holds files only (a slot that is
    a folder would stop the run at its first checkpoint, after the metrics were rewritten)."""
    folder = Path(run_dir)
    for path in sorted(
        [*folder.iterdir(), *((folder / checkpoints).iterdir() if (folder / checkpoints).is_dir() else [])]
    ):
        refuse_link(path, folder, f"--resume {run_dir}")
        refuse_shared(path, folder, f"--resume {run_dir}")
        if path.parent.name == checkpoints and not path.is_file():
            raise UserError(
                f"--resume {run_dir}: {path.relative_to(folder)} is not a file (remove it to resume "
                "from the other checkpoint)"
            )


def ours(path: Path) -> bool:
    """A run's lock, or another rank's throwaway write test (which a rank behind rank 0 may make inside
    the run folder rank 0 has just made): neither is a run's file."""
    return path.name == LOCK_NAME or path.name.startswith(PROBE_PREFIX)
