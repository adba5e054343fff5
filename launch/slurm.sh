#!/usr/bin/env bash
# One peer per rank on a cluster: sbatch --ntasks=300 launch/slurm.sh --algo dfedavg
#SBATCH --job-name=p2pfl
#SBATCH --output=p2pfl-%j.log
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
srun .venv/bin/python -m p2pfl.run "$@"
