# Two commands on a fresh machine: `make install` then `make run`; `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PRECOMPILED := p2pfl/ntk/__pycache__/.precompiled
# torch/torchvision pinned to the versions this project is tested with.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# Open MPI refuses root unless told otherwise (containers and CI run as root).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install run test test-fast bench bench-flower gpu-smoke gpu-carry gpu-check figures figures-quick data clean

install: $(VENV)/.installed data $(PRECOMPILED)

$(VENV)/.installed: setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PINS)
	$(PY) -m pip install --quiet -e '.[mpi,dev]'
	touch $@

# The NTK loop compiled (numba, about a minute) into its cache once, not by the first run or by
# every MPI rank at once; again whenever its source changes.
$(PRECOMPILED): $(VENV)/.installed p2pfl/ntk/split_loop.py p2pfl/ntk/numerics.py
	$(PY) -m p2pfl.ntk.precompile
	@mkdir -p $(@D) && touch $@

# Fashion-MNIST from Debian's package, where apt-get is available and we may use it.
data:
	@if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then \
		echo "Fashion-MNIST: /usr/share/datasets/fashion-mnist"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)) && \
		echo "Fashion-MNIST installed from dataset-fashion-mnist"; \
	else \
		echo "note: install Debian's dataset-fashion-mnist or pass --data-dir to use Fashion-MNIST"; \
	fi

run: install
	$(PY) -m p2pfl.run

# The layers contract (.importlinter: imports point down only), ruff's check and its formatting, then the tests on a worker per core,
# at most 4 (13 minutes on 2 cores, 2026-12-05; tests/conftest.py gives each process one OpenMP thread);
# worksteal keeps the long ones from ending last on one worker.
test: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check p2pfl topologies analysis launch bench tests examples
	$(VENV)/bin/ruff format --check p2pfl topologies analysis launch bench tests examples
	P2PFL_NO_DOWNLOAD=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist worksteal --durations=25 tests

# What a contributor runs while working: every test but those that start mpirun or a fresh interpreter and
# those slow by design; of the multi-rank tests, the tiny layout cases (conformance, faults) stay:
# they share one mpirun per rank count (markers in setup.cfg; a launch without its marker fails its test).
test-fast: install
	P2PFL_NO_DOWNLOAD=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist worksteal --durations=10 \
		-m "(not mpi or layouts) and not subprocess and not slow" tests

# Each on the CPU and, where CUDA is present, on the GPU beside it; TCT's stage 1 at paper scale on the GPU only.
bench: install
	$(PY) bench/bench_dfedavg.py
	$(PY) bench/bench_ntk.py
	$(PY) bench/bench_cnn.py
	$(PY) bench/bench_cnn.py --tct-stage1 --device gpu --repeats 1
	$(PY) bench/bench_eval.py
	$(PY) bench/bench_codecs.py
	$(PY) bench/bench_async.py

# p2pfl beside Flower's simulation engine on the same FedAvg work (installs flwr with Ray first).
bench-flower: install
	$(PY) -m pip install --quiet -e '.[flower]'
	$(PY) bench/vs_flower.py

# Every algorithm x model pair for 2 rounds on the GPU, one OK/FAIL line each (without CUDA: one line, skipped).
gpu-smoke: install
	$(PY) bench/gpu_smoke.py --device cuda

# The device check on a bare GPU machine, without installing: `make gpu-carry` here prepares .gpu-carry (what
# that machine lacks: tomli-w, Fashion-MNIST; under the 64 MiB a device call carries), then there
# `bash bench/gpu_check.sh python3` with .gpu-carry carried (or `make gpu-check PY=python3`): keyed hashes,
# the cuda tests, the speed figures, the smoke matrix and the conformance cuda tests in under 9 minutes,
# written to $$OUT as a summary and one archive of the logs.
gpu-carry: $(VENV)/.installed data
	$(PY) bench/gpu_carry.py .gpu-carry

gpu-check:
	bash bench/gpu_check.sh $(PY)

# The NTK-DFL paper's figures: runs, then PNGs with captions in runs/<experiment>/figures/.
figures: install
	$(PY) -m launch.figures ntk-dfl-figures-paper --jobs 2

figures-quick: install
	$(PY) -m launch.figures ntk-dfl-figures-quick --jobs 2

clean:
	rm -rf $(VENV) runs build *.egg-info
