#!/usr/bin/env bash
# How long a stop by signal takes mid-round: a DFedAvg run with long rounds, SIGTERM 2 s into round 2,
# the seconds until the process ends, its exit status and its last line (docs/reliability.md).
#   bash bench/stop_time.sh          # one process
#   bash bench/stop_time.sh 3        # launch/mpirun.sh 3 (the SIGTERM reaches the ranks as SIGUSR1)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-0}
out=$(mktemp -d)/run
err=$(mktemp)
args=(--dataset synthetic --peers 12 --kappa 3 --rounds 6 --local-epochs 3000 --algo dfedavg --no-progress
      --checkpoint-every 0 --out "$out")
if [ "$ranks" -gt 0 ]; then bash launch/mpirun.sh "$ranks" "${args[@]}" 2>"$err" &
else .venv/bin/python -m p2pfl.run "${args[@]}" 2>"$err" & fi
job=$!
until [ -f "$out/metrics.jsonl" ] && [ "$(wc -l < "$out/metrics.jsonl")" -ge 1 ]; do sleep 0.2; done
sleep 2
start=$(date +%s.%N)
kill -TERM "$job"
status=0
wait "$job" || status=$?
echo "exit $status after $(echo "$(date +%s.%N) - $start" | bc) s; round 1 took $(python3 -c "import json, sys; print(json.loads(open(sys.argv[1]).readline())['round_s'])" "$out/metrics.jsonl") s"
tail -1 "$err"
