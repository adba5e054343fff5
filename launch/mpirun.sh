#!/usr/bin/env bash
# Run p2pfl under Open MPI from the project's virtualenv: launch/mpirun.sh RANKS [p2pfl flags...]
#   launch/mpirun.sh 4 --algo dfedavg --peers 30     # 4 ranks on this machine (oversubscribed)
set -euo pipefail
ranks=${1:?usage: launch/mpirun.sh RANKS [p2pfl flags...]}
shift
here=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$here/.venv/bin/mpirun" -n "$ranks" --oversubscribe "$here/.venv/bin/python" -m p2pfl.run "$@"
