#!/usr/bin/env bash
# Run p2pfl under Open MPI from the project's virtualenv: launch/mpirun.sh RANKS [p2pfl flags...]
#   launch/mpirun.sh 4 --algo dfedavg --peers 30     # 4 ranks on this machine (oversubscribed)
# A refused run ends with p2pfl's one line and its exit status (2): mpirun runs without its banner for a
# rank's non-zero status, and p2pfl hands the status back through $P2PFL_STATUS_FILE.
# A SIGTERM or Ctrl-C to this script (a scheduler's stop, or the terminal's) reaches the ranks as SIGUSR1,
# which mpirun forwards: they save the last completed round and exit 143 (mpirun itself answers SIGTERM
# and SIGINT by killing the ranks at once). A SIGHUP (the terminal closed) is passed on the same way, and
# the script exits 129 as a hung-up process does: no rank runs on detached (mpirun answers SIGHUP by
# ending at once, and the ranks' last line was lost). The filter of mpirun's banners ignores these signals
# (a terminal's Ctrl-C or hang-up reaches it too) and ends with mpirun's output: the ranks' line is printed.
set -euo pipefail
ranks=${1:?usage: launch/mpirun.sh RANKS [p2pfl flags...]}
shift
here=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
P2PFL_STATUS_FILE=$(mktemp)
export P2PFL_STATUS_FILE
trap 'rm -f "$P2PFL_STATUS_FILE"' EXIT
# mpirun in a session of its own: a Ctrl-C at the terminal (SIGINT to the foreground process group) reaches
# this script alone, which forwards it below; mpirun would end the job at once, saving nothing, without a word.
# A rank ended by a signal before its run started (a user's kill, its node's OOM killer) ends the job:
# mpirun stops the others, whose banner about it is left out here; p2pfl's own line says what happened.
setsid "$here/.venv/bin/mpirun" --runtime-options error-nonzero-status=false -n "$ranks" --oversubscribe \
    "$here/.venv/bin/python" -m p2pfl.run "$@" 2> >(trap '' HUP INT TERM; exec awk '
        /^--------------------+$/ { if (held) { held = held "\n" $0; if (held !~ /(noticed that process|exited on signal|prterun|mpirun)/) print held; held = ""; fflush() } else held = $0; next }
        held { held = held "\n" $0; next }
        { print; fflush() }
        END { if (held) print held }' >&2) &
job=$!
trap 'kill -USR1 "$job" 2>/dev/null' TERM INT
hung_up=
trap 'hung_up=1; kill -USR1 "$job" 2>/dev/null' HUP
while kill -0 "$job" 2>/dev/null; do
    wait "$job" && status=0 || status=$?
done
recorded=$(cat "$P2PFL_STATUS_FILE" 2>/dev/null || true)
if [ "$status" = 0 ] && [ -z "$recorded" ]; then
    status=1  # no rank reached the end of p2pfl's main (killed, or mpirun failed to start it)
elif [ "$status" -gt 128 ] && [ -z "$recorded" ]; then
    # a signal ended the job before any rank's p2pfl could say so (killed while Python itself started)
    echo "p2pfl: stopped before the run started" >&2
fi
status=${recorded:-$status}
if [ -n "$hung_up" ] && [ "$status" = 143 ]; then
    status=129  # the stop was the terminal's SIGHUP, forwarded as SIGUSR1
fi
exit "$status"
