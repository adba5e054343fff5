"""The command line over p2pfl.runner.simulation: parse the flags, run, turn what stops a run into one line and an
exit status.

    python -m p2pfl.run --algo dfedavg --peers 30
    mpirun -n 4 --oversubscribe python -m p2pfl.run --algo dfedavg --peers 30
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the CLI only: a script or notebook calling main() keeps its own handlers
    from p2pfl.stopping import quiet_until_started

    quiet_until_started()

from p2pfl.threads import threads_per_rank  # noqa: E402

threads_per_rank()  # before torch is imported

import traceback  # noqa: E402

from p2pfl import stopping  # noqa: E402
from p2pfl.comm import launched_by_mpi, mpi_world  # noqa: E402
from p2pfl.comm.transport import CommTimeout  # noqa: E402
from p2pfl.runner.configure import parse_config, resolve  # noqa: E402
from p2pfl.errors import DivergenceError, Interrupted, OutOfGPUMemory, UserError  # noqa: E402
from p2pfl.runner.simulation import execute  # noqa: E402
from p2pfl.stopping import record_status  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    stopping.CLI[0] = argv is None  # the command line's process (python -m p2pfl.run, p2pfl-run), not a caller's
    code = _main(argv)
    if mpi_world()[0] == 0:
        record_status(code)
    return code


def _main(argv: list[str] | None) -> int:
    rank = 0
    try:
        rank, size, local_rank = mpi_world()
        cfg = resolve(parse_config(argv), size)
        execute(cfg, rank, size, local_rank)
        return 0
    except UserError as exc:
        if rank == 0:
            print(f"p2pfl: error: {exc}", file=sys.stderr)
        return 2
    except OutOfGPUMemory as exc:  # raised on the rank that ran out, which may not be rank 0
        print(f"p2pfl: error: {exc}", file=sys.stderr)
        if _under_mpi_world():
            sys.stderr.flush()
            from mpi4py import MPI

            record_status(2)
            MPI.COMM_WORLD.Abort(2)  # the other ranks would wait for this one's messages
        return 2
    except OSError as exc:  # a full disk, a folder made read-only mid-run: one line, the files before intact
        where = f" {exc.filename}" if exc.filename else ""
        print(
            f"p2pfl: stopped: cannot write{where} ({exc.strerror or exc}); the files written before it are intact",
            file=sys.stderr,
        )
        if _under_mpi_world():
            sys.stderr.flush()
            from mpi4py import MPI

            record_status(5)
            MPI.COMM_WORLD.Abort(5)  # the other ranks would wait for this one
        return 5
    except DivergenceError as exc:
        if rank == 0:
            print(f"p2pfl: diverged: {exc}", file=sys.stderr)
        return 3
    except Interrupted as exc:
        if rank == 0:
            print(f"p2pfl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # before the run started
        return 130
    except CommTimeout as exc:
        if exc.reporter != rank and exc.notify is not None:
            exc.notify()  # the reporter prints the line and ends the job; if it cannot, this rank does
        print(f"p2pfl: stopped: {exc}", file=sys.stderr)
        if _under_mpi_world():
            record_status(4)
            sys.stderr.flush()
            os._exit(4)  # MPI_Finalize would wait for the missing rank
        return 4
    except Exception:
        traceback.print_exc()
        if _under_mpi_world():
            from mpi4py import MPI

            record_status(1)
            MPI.COMM_WORLD.Abort(1)  # other ranks would wait forever on this one
        return 1


def _under_mpi_world() -> bool:
    return launched_by_mpi()


if __name__ == "__main__":
    sys.exit(main())
