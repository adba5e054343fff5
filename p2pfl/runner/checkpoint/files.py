"""A checkpoint's files: how each rank's captured state is written and read back.

Each rank writes one file with its peers' rows (weights and the algorithm's per-peer state) and rank 0
adds the server's state and the metrics rows so far. Files are written to a temporary name and renamed,
in two alternating slots, and `latest.json` names the last complete slot only after every rank has
written: a crash mid-write leaves the previous checkpoint intact, and a damaged newest slot falls back
to the other. Loading takes plain tensors, lists and numbers (torch.load with weights_only=True, no
unpickled objects) and picks rows by peer id, so a run resumes on any number of ranks. Random draws are
keyed by (seed, purpose, round, peer) (p2pfl.seeding), so no generator state needs saving.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from p2pfl.errors import UserError
from p2pfl.runner.paths import read_regular

FOLDER = "checkpoint"
LATEST = "latest.json"


def _file(folder: Path, slot: int, rank: int, ranks: int) -> Path:
    return folder / f"slot{slot}-rank{rank}-of{ranks}.pt"


def atomic_write(path: Path, write) -> None:
    """write(a temporary name), then rename: a write that fails (a full disk, a read-only folder) leaves
    the file as it was and raises OSError naming it (torch.save reports a failed write as RuntimeError)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if tmp.is_symlink():  # written through, a planted link would put the file elsewhere: drop the link
            tmp.unlink()
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed"
        raise OSError(getattr(exc, "errno", None) or 5, reason, str(path)) from exc


def write(state: dict, run_dir: Path, transport) -> None:
    """Every rank's captured state into the slot latest.json does not name, then latest.json (rank 0)."""
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)  # every rank writes here: the run folder must be shared
    slot = _next_slot(folder)
    atomic_write(_file(folder, slot, transport.rank, transport.size), lambda p: torch.save(state, p))
    transport.barrier()  # every rank's file is complete before latest.json points at the slot
    if transport.rank == 0:
        meta = {"round": state["round"], "slot": slot, "ranks": transport.size}
        atomic_write(folder / LATEST, lambda p: p.write_text(json.dumps(meta)))
        keep = {_file(folder, s, r, transport.size).name for s in (0, 1) for r in range(transport.size)}
        for old in folder.glob("slot*.pt"):  # files of a layout this run has left
            if old.name not in keep:
                old.unlink()


def _next_slot(folder: Path) -> int:
    """The slot latest.json does not name: the newest checkpoint is never overwritten, so a damaged write
    leaves the previous one to fall back on. Every rank reads the same latest.json (rank 0 rewrites it
    after the barrier of a save, and the rounds between two saves synchronise the ranks)."""
    try:
        return 1 - _latest(folder)[1]
    except _Damaged:
        return 0


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run folder holds a checkpoint (readable or not: read() says which)."""
    folder = Path(run_dir) / FOLDER
    return (folder / LATEST).is_file() or any(folder.glob("slot*.pt"))


@dataclass
class Snapshot:
    """A checkpoint as read: the rounds done, every rank's file, and a line to print where the newest
    slot was damaged and the previous one is used."""

    round: int
    parts: list[dict]
    note: str | None = None

    @property
    def rows(self) -> list[dict]:
        return self.parts[0]["rows"]


class _Damaged(Exception):
    """A slot or latest.json that cannot be used; the message says what is wrong with it."""


def _latest(folder: Path) -> tuple[int, int, int]:
    """(round, slot, ranks) from latest.json."""
    try:
        meta = json.loads(read_regular(folder / LATEST).decode())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _Damaged(f"{LATEST} cannot be read ({exc.__class__.__name__})")
    fields = meta if isinstance(meta, dict) else {}
    values = [fields.get(k) for k in ("round", "slot", "ranks")]
    if (
        not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        or values[1] not in (0, 1)
        or values[0] < 1
        or values[2] < 1
    ):
        raise _Damaged(f"{LATEST} does not name a round, a slot (0 or 1) and a rank count")
    return values[0], values[1], values[2]


def _read_slot(folder: Path, slot: int, ranks: int) -> list[dict]:
    """Every rank's file of a slot, checked for the shape save() gives them. torch.load with
    weights_only builds tensors and plain containers only: a file naming any other class is refused
    unrun."""
    parts = []
    for r in range(ranks):
        path = _file(folder, slot, r, ranks)
        try:
            if path.exists() and not path.is_file():  # a pipe or a device would block torch.load
                raise _Damaged(f"{path.name} is not a regular file")
            part = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise _Damaged(f"{path.name} is missing")
        except Exception as exc:  # noqa: BLE001 - truncated, random or foreign bytes: all mean damaged
            raise _Damaged(f"{path.name} cannot be read ({exc.__class__.__name__})")
        _check_part(part, path.name, root=r == 0)
        parts.append(part)
    if len({part["round"] for part in parts}) != 1:
        raise _Damaged("its files disagree on the round")
    return parts


def _check_part(part, name: str, root: bool) -> None:
    ok = (
        isinstance(part, dict)
        and isinstance(part.get("round"), int)
        and part["round"] >= 1
        and isinstance(part.get("peers"), list)
        and all(isinstance(p, int) for p in part["peers"])
        and isinstance(part.get("flat"), torch.Tensor)
        and part["flat"].dim() == 2
        and len(part["flat"]) == len(part["peers"])
        and isinstance(part.get("peer_state"), dict)
        and isinstance(part.get("pooled"), dict)
    )
    if ok and root:
        ok = (
            isinstance(part.get("server"), dict)
            and isinstance(part.get("rows"), list)
            and all(isinstance(row, dict) for row in part["rows"])
            and len(part["rows"]) == part["round"]
            and (part.get("global_weights") is None or isinstance(part.get("global_weights"), torch.Tensor))
        )
    if not ok:
        raise _Damaged(f"{name} does not hold a checkpoint")


def read(run_dir: Path) -> Snapshot:
    """The newest readable checkpoint of the run. save() alternates two slots, so where the newest is
    damaged the previous one is used (the note says so); where neither can be read, one UserError
    saying what is damaged. Reads only: nothing in the folder changes."""
    folder = Path(run_dir) / FOLDER
    problems, chosen, slot = [], None, None
    try:
        done, slot, ranks = _latest(folder)
    except _Damaged as exc:
        problems.append(str(exc))
    if slot is not None:
        try:
            chosen = (slot, _read_slot(folder, slot, ranks))
        except _Damaged as exc:
            problems.append(f"slot {slot} (round {done}): {exc}")
    if chosen is None:  # the other slot, or either where latest.json is unusable: by the files present
        options = []
        for other in (0, 1):
            if other == slot:
                continue
            for path in sorted(folder.glob(f"slot{other}-rank0-of*.pt")):
                count = path.name.rsplit("-of", 1)[1][: -len(".pt")]
                try:
                    options.append((other, _read_slot(folder, other, int(count))))
                except (_Damaged, ValueError) as exc:
                    problems.append(f"slot {other}: {exc}")
        if not options:
            raise UserError(
                f"--resume {run_dir}: no checkpoint can be read: {'; '.join(problems) or 'none was written'}"
            )
        chosen = max(options, key=lambda option: option[1][0]["round"])
    note = (
        None
        if not problems
        else (
            f"the newest checkpoint is damaged ({'; '.join(problems)}); resuming from "
            f"the previous one, after round {chosen[1][0]['round']}"
        )
    )
    return Snapshot(chosen[1][0]["round"], chosen[1], note)
