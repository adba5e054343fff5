#!/usr/bin/env bash
# One peer per rank on a cluster: sbatch --ntasks=300 launch/slurm.sh --algo dfedavg
# SLURM sends the ranks SIGTERM 90 s before the time limit (--signal): each saves the last completed round
# and exits 143; continue with the same command plus --resume RUN_FOLDER.
#SBATCH --job-name=p2pfl
#SBATCH --output=p2pfl-%j.log
#SBATCH --signal=TERM@90
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
srun .venv/bin/python -m p2pfl.run "$@"
