#!/usr/bin/env bash
# The device check, on a bare GPU machine as it is (torch with CUDA in its Python, no network, no time to
# install), in under 9 minutes. Its steps, most informative first, each with its own time limit (a step that
# would pass the overall limit is cut, and says so):
#   1. keyed hashes: the draws behind every minibatch and dropout mask, bit for bit the CPU's on the GPU;
#   2. the cuda tests (tests/test_cuda.py): each path the MLP runs do not take, round by round against the CPU;
#   3. the GPU speed figures (bench/gpu_figures.py), with peak GPU memory;
#   4. the smoke matrix (every algorithm x model pair for 2 rounds on the GPU);
#   5. the conformance cuda tests (every algorithm's run on the GPU against its run on the CPU);
#   6. the speed figures' CPU baselines, where time is left.
# Each step's verdict is its exit status and its result file (pytest's JUnit XML, the figures' and the smoke
# matrix's JSON), never a log's last line. What it writes comes back as two files: $OUT/gpu_check.txt (the
# summary, also printed) and $OUT/gpu_check_logs.tar.gz (every log and result file).
#
#   make gpu-carry                            (here: .gpu-carry/, what that machine lacks: tomli-w, Fashion-MNIST)
#   bash bench/gpu_check.sh [PYTHON]          (there, with .gpu-carry carried; default python3)
#
# The carried folder ($GPU_CHECK_CARRY, default .gpu-carry) goes on PYTHONPATH and is the data root; without
# data, a generated MNIST-format stand-in of the same size (timings only). A rehearsal on a machine without a
# GPU: GPU_CHECK_DEVICE=cpu, and GPU_CHECK_QUICK=1 for tiny sizes (tests/test_gpu_check.py runs it so, with
# the GPU machine's missing modules blocked).
set -u
cd "$(dirname "$0")/.."
PY=${1:-${PY:-python3}}
LIMIT=${GPU_CHECK_SECONDS:-540}
START=$SECONDS
DEVICE=${GPU_CHECK_DEVICE:-cuda}
QUICK=${GPU_CHECK_QUICK:-}
STEPS_ONLY=${GPU_CHECK_STEPS:-}  # space-separated step names: run these alone (the rehearsal's tests of one step)
CARRY=${GPU_CHECK_CARRY:-$PWD/.gpu-carry}
DEST=${OUT:-$PWD/runs/gpu-check}
WORK=$(mktemp -d)  # logs and results, archived into $DEST at the end
DATA_TMP=$(mktemp -d)  # a stand-in dataset, never archived
mkdir -p "$DEST" "$WORK/logs"
trap 'rm -rf "$WORK" "$DATA_TMP"' EXIT
: > "$WORK/steps.tsv"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" P2PFL_NO_DOWNLOAD=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 P2PFL_CHECK_DEVICE=$DEVICE
[ -d "$CARRY/site" ] && export PYTHONPATH="$CARRY/site:$PYTHONPATH"
[ -d "$CARRY/fashion-mnist" ] && export P2PFL_DATA="$CARRY/fashion-mnist"

finish() {  # the summary from the recorded steps and results, then the archive; exit 1 if a step failed
    "$PY" bench/gpu_report.py "$WORK" "$((SECONDS - START))" | tee "$DEST/gpu_check.txt"
    local verdict=${PIPESTATUS[0]}
    tar czf "$DEST/gpu_check_logs.tar.gz" -C "$WORK" .
    exit "$verdict"
}
gate() {  # a reason the check cannot start: the summary says it, exit 2
    printf 'gate\t2\t0\t%s\n' "$1" >> "$WORK/steps.tsv"
    echo "gpu-check: $1" >&2
    if command -v "$PY" > /dev/null && "$PY" -c "import json" 2> /dev/null; then
        "$PY" bench/gpu_report.py "$WORK" 0 > "$DEST/gpu_check.txt"
    else
        echo "gpu-check: $1" > "$DEST/gpu_check.txt"
    fi
    exit 2
}

command -v "$PY" > /dev/null || gate "no interpreter $PY (name one: bash bench/gpu_check.sh PYTHON)"
missing=$("$PY" - << 'EOF' 2>&1
import importlib
gone = []
for m in ("torch", "numpy", "networkx", "pytest", "tomli_w"):  # every step's; the rest is imported where used
    try:
        importlib.import_module(m)
    except ImportError:
        gone.append(m)
print(" ".join(gone))
EOF
)
[ -n "$missing" ] && gate "$PY lacks $missing (make gpu-carry here, and carry .gpu-carry with the device call)"
if [ "$DEVICE" != cpu ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    gate "no CUDA device here ($PY's torch sees none); nothing to check"
fi
"$PY" -c "
import torch
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB' if p else 'no GPU (a rehearsal on $DEVICE)', f'torch {torch.__version__}', sep=', ')
" > "$WORK/machine.txt" 2>&1
echo "$(nproc) CPU cores, commit $(git rev-parse --short HEAD 2> /dev/null || echo '?')" >> "$WORK/machine.txt"

DATA=()
if [ -n "${P2PFL_DATA:-}" ] || [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "Fashion-MNIST" > "$WORK/data.txt"
else
    "$PY" -c "from pathlib import Path; from tests.conftest import write_stripes; write_stripes(Path('$DATA_TMP'), 10, 60000, 10000)"
    DATA=(--dataset mnist --data-dir "$DATA_TMP")
    echo "a generated MNIST-format stand-in (no Fashion-MNIST here): timings only" > "$WORK/data.txt"
fi

# step NAME SECONDS COMMAND...: run it within its limit (cut to what is left), log it, record its status
step() {
    local name=$1 limit=$2 left=$((LIMIT - (SECONDS - START))) began=$SECONDS code
    shift 2
    if [ -n "$STEPS_ONLY" ] && [[ " $STEPS_ONLY " != *" $name "* ]]; then
        return 0
    fi
    if [ "$left" -lt 20 ]; then
        printf '%s\t%s\t0\tno time left\n' "$name" 125 >> "$WORK/steps.tsv"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    code=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - began))" "$limit" >> "$WORK/steps.tsv"
    return $code
}
pytest_step() {  # NAME SECONDS [pytest args]: its JUnit XML beside the log
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" -m pytest -q -p no:cacheprovider -m cuda --junitxml="$WORK/$name.xml" "$@"
}
XDIST=()
"$PY" -c "import xdist" 2> /dev/null && XDIST=(-n 4)
SIZE=()  # the figures' sizes; the rehearsal's are tiny
[ -n "$QUICK" ] && SIZE=(--peers 12 --samples 60 --rounds 1 --epochs 1)
figure() {  # NAME ROLE SECONDS [flags]: ROLE gpu (the device checked) or cpu (its baseline)
    local name=$1 role=$2 limit=$3 device=$DEVICE
    shift 3
    [ "$role" = cpu ] && device=cpu
    step "figure-$name-$role" "$limit" "$PY" bench/gpu_figures.py "$name" --device "$device" "${DATA[@]}" \
        --json "$WORK/figure-$name-$role.json" "$@" "${SIZE[@]}"
}

# numba's compile of the CPU's NTK loop (about 2 minutes the first time) runs beside the GPU steps; the
# CPU side of the NTK comparisons waits for its cache
( timeout -k 5 300 "$PY" -m p2pfl.ntk.precompile > "$WORK/logs/precompile.log" 2>&1 ) &

pytest_step keyed 90 tests/test_cuda.py -k keyed
if [ -n "$QUICK" ]; then
    pytest_step cuda-tests 200 tests/test_cuda.py -k "dfedavgm"
else
    pytest_step cuda-tests 200 "${XDIST[@]}" tests/test_cuda.py -k "not keyed"
fi
figure dfedavg gpu 45 --rounds 3
figure ntk-dfl gpu 75 --rounds 2
figure tct-stage1 gpu 75 --rounds 2
figure dfedavg-cnn gpu 60 --rounds 2
ONLY=()
[ -n "$QUICK" ] && ONLY=(--only dfedavg)
step smoke 150 "$PY" bench/gpu_smoke.py --device "$DEVICE" --jobs 4 --timeout 120 --results "$WORK/smoke.jsonl" "${ONLY[@]}"
if [ -n "$QUICK" ]; then
    pytest_step conformance 120 tests/test_conformance.py -k "dfedavg and not dfedavgm"
else
    pytest_step conformance 120 "${XDIST[@]}" tests/test_conformance.py
fi
wait
if [ "$DEVICE" != cpu ]; then  # the baselines the figures are set beside, where time is left
    figure ntk-dfl cpu 100 --rounds 1
    figure dfedavg cpu 60 --rounds 1
    figure tct-stage1 cpu 80 --rounds 1 --epochs 1
fi
finish
