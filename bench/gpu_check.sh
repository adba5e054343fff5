#!/usr/bin/env bash
# The device check: on a bare GPU machine (torch with CUDA in its Python, no network, no time to install),
# in under 9 minutes, one summary of
#   - the smoke matrix (every algorithm x model pair for 2 rounds on the GPU, OK/FAIL),
#   - the speed figures, each beside this machine's CPU in this run, with peak GPU memory,
#   - the `cuda` tests (each algorithm, a dropout conv net, a batch-norm net and NTK-DFL's batched evolution
#     against the CPU), with the time that is left.
# Every step has its own time limit, and a step that would pass the overall limit is skipped (said so).
#
#   bash bench/gpu_check.sh [PYTHON]          (default: python3; or make gpu-check PY=python3)
#
# It installs nothing. Data: $P2PFL_DATA or Debian's Fashion-MNIST; without either, a generated MNIST-format
# stand-in of the same size (timings only). The summary is also written to $OUT/gpu_check.txt where OUT is set,
# and each step's log beside it.
set -u
cd "$(dirname "$0")/.."
PY=${1:-${PY:-python3}}
LIMIT=${GPU_CHECK_SECONDS:-530}  # the whole check
START=$SECONDS
LOGS=${OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
SUMMARY="$LOGS/gpu_check.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

# A rehearsal of this script's mechanics on a machine without a GPU: GPU_CHECK_DEVICE=cpu (and GPU_CHECK_FLAGS,
# say "--peers 12", for figures of a size the CPU finishes); not a check of anything on a GPU.
DEVICE=${GPU_CHECK_DEVICE:-cuda}
read -r -a FLAGS <<< "${GPU_CHECK_FLAGS:-}"
if ! command -v "$PY" > /dev/null; then
    echo "gpu-check: no interpreter $PY (name one: bash bench/gpu_check.sh PYTHON)"
    exit 2
fi
missing=$("$PY" - <<'EOF' 2>&1
import importlib
need = ["torch", "numpy", "networkx", "matplotlib", "tqdm", "skimage", "numba", "threadpoolctl", "tomli_w", "pytest"]
gone = [m for m in need if importlib.util.find_spec(m) is None]
print(" ".join(gone))
EOF
)
if [ -n "$missing" ]; then
    echo "gpu-check: $PY lacks $missing (install them, or name another interpreter: bash bench/gpu_check.sh PYTHON)"
    exit 2
fi
if [ "$DEVICE" != cpu ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu-check: no CUDA device here ($PY's torch sees none); nothing to check"
    exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" P2PFL_NO_DOWNLOAD=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# step NAME SECONDS COMMAND...: run it with its limit (cut to what is left of the whole), log it, return its status
step() {
    local name=$1 limit=$2 left=$((LIMIT - (SECONDS - START)))
    shift 2
    if [ "$left" -lt 20 ]; then
        echo "skipped: no time left" > "$LOGS/$name.log"
        return 124
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
}

say "p2pfl device check: $("$PY" -c "import torch; p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None; print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} GPU(s)' if p else 'no GPU (a rehearsal on $DEVICE)', f'torch {torch.__version__}', sep=', ')"), $(nproc) CPU cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

DATA=()
if [ -n "${P2PFL_DATA:-}" ] || [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    DATA_NOTE="Fashion-MNIST"
else
    STAND_IN="$LOGS/stand-in-mnist"
    mkdir -p "$STAND_IN"
    "$PY" -c "from pathlib import Path; from tests.conftest import write_stripes; write_stripes(Path('$STAND_IN'), 10, 60000, 10000)"
    DATA=(--dataset mnist --data-dir "$STAND_IN")
    DATA_NOTE="a generated MNIST-format stand-in (no Fashion-MNIST here): timings only"
fi

# numba's compile of the CPU's NTK loop (about 2 minutes the first time) runs beside the GPU steps
( timeout -k 5 300 "$PY" -m p2pfl.ntk.precompile > "$LOGS/precompile.log" 2>&1 ) &
PRECOMPILE=$!

step smoke 150 "$PY" bench/gpu_smoke.py --device "$DEVICE" --jobs 4 --timeout 120
code=$?
ok=$(grep -c '^OK' "$LOGS/smoke.log"); fail=$(grep -c '^FAIL' "$LOGS/smoke.log")
say "smoke matrix: $ok OK, $fail FAIL$([ $code = 124 ] && echo ' (stopped at its time limit)')"
grep '^FAIL' "$LOGS/smoke.log" | sed 's/^/  /' | tee -a "$SUMMARY"

wait $PRECOMPILE

# figure NAME DEVICE SECONDS [flags]: one speed figure's JSON line (or nothing)
figure() {
    local name=$1 device=$2 limit=$3
    shift 3
    [ "$device" = cuda ] && device=$DEVICE
    step "$name-$device" "$limit" "$PY" bench/gpu_figures.py "$name" --device "$device" "${DATA[@]}" "${FLAGS[@]}" "$@" \
        && tail -1 "$LOGS/$name-$device.log"
}
say "speed on $DATA_NOTE (seconds per round of training and exchange, the GPU synchronized; best of the rounds timed):"
report() {
    "$PY" - "$@" <<'EOF' | tee -a "$SUMMARY"
import json, sys
name, goal, cpu, gpu, scale = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
def read(text):
    try:
        return json.loads(text)
    except ValueError:
        return None
c, g = read(cpu), read(gpu)
cpu_s = c["best"] * scale if c else None
peak = f", peak GPU {g['peak_gpu_gb']:.2f} GB" if g and g["peak_gpu_gb"] is not None else ""
line = f"  {name:34s} {g['device'] if g else 'gpu'} " + (f"{g['best']:7.3f} s{peak}" if g else "   FAIL or over its limit")
line += ", cpu " + (f"{cpu_s:7.2f} s" + (f" (1 epoch x {scale:g})" if scale != 1 else "") if c else "  not measured")
if c and g:
    line += f", {cpu_s / g['best']:.1f}x"
    if c.get("taus") and g.get("taus"):
        same = sum(a == b for a, b in zip(c["taus"], g["taus"]))
        line += f"; same t chosen at {same} of {len(g['taus'])} peers"
if g and not g.get("finite", True):
    line += "; NON-FINITE weights"
print(line + f"   [goal {goal}]")
EOF
}
report "DFedAvg, 300 peers, MLP" "<= 0.15 s" "$(figure dfedavg cpu 60 --rounds 1)" "$(figure dfedavg cuda 45 --rounds 3)" 1
report "NTK-DFL, 300 peers (paper preset)" "<= 1.5 s" "$(figure ntk-dfl cpu 100 --rounds 1)" "$(figure ntk-dfl cuda 75 --rounds 2)" 1
report "TCT stage 1, paper scale" "<= 3 s" "$(figure tct-stage1 cpu 80 --rounds 1 --epochs 1)" "$(figure tct-stage1 cuda 75 --rounds 2)" 5
report "DFedAvg, 300 peers, cnn-fmnist" "<= 1 s" "" "$(figure dfedavg-cnn cuda 60 --rounds 2)" 1
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 4)
step cuda-tests 200 "$PY" -m pytest -q -m cuda -p no:cacheprovider "${XDIST[@]}" tests/test_conformance.py tests/test_cuda.py
code=$?
say "cuda tests: $(grep -E '(passed|failed|error|skipped)' "$LOGS/cuda-tests.log" | tail -1)$([ $code = 124 ] && echo ' (stopped at its time limit)')"
grep -E '^(FAILED|ERROR)' "$LOGS/cuda-tests.log" | cut -c1-200 | sed 's/^/  /' | tee -a "$SUMMARY"

say "logs: $LOGS; $((SECONDS - START)) s in all"
