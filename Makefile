# Two commands set everything up on a fresh machine:
#   make train   creates .venv, installs hetrl (the core package only), trains CartPole-v1
#   make test    also installs the extras (SageMaker SDK, MuJoCo, Atari, video, W&B, test tools),
#                then runs lint (ruff, mypy) and the tests
#
# torch: TORCH pins the CPU build this project is developed against. Where plain PyPI would
# hand you a multi-GB CUDA build you do not want, point pip at PyTorch's CPU wheels:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# On a GPU host, install the torch you want first; any torch >= 2.1 satisfies hetrl.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PIP_FLAGS ?= --disable-pip-version-check --no-input
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup train test test-quick test-lowest lint bench protos docs tables clean

# Training needs only the core package; the extras (the sagemaker SDK alone is ~800 MB)
# come with the tests.
$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install $(PIP_FLAGS) -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	$(PY) -m pip install $(PIP_FLAGS) -q -e '.[dev,docs,cluster,sagemaker,mujoco,atari,bench,video,track,plots]'
	touch $@

setup: $(VENV)/.installed

train: $(VENV)/.core
	$(VENV)/bin/hetrl local --env CartPole-v1 --workers 2 --envs-per-worker 8 \
		--total-steps 300000 --seed 1

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: every test but those marked slow (each took 7 s or more on a busy 2-core
# machine; end-to-end runs, mostly); one short run of each shape stays in (a local run,
# Ctrl-C on a whole run, an emulated job). make test, which CI runs, still runs them all.
test-quick: lint
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Each lower bound in pyproject.toml is a version a test ran: .venv-lowest holds every
# runtime dependency at its lower bound (tests/lowest.py), and the core tests run there:
# the quick ones, and the slow ones marked lowest (torch.distributed, whole local runs).
LOWEST := .venv-lowest
test-lowest:
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install $(PIP_FLAGS) -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(LOWEST)/bin/python tests/lowest.py > $(LOWEST)/lowest.txt
	$(LOWEST)/bin/python -m pip install $(PIP_FLAGS) -q -c $(LOWEST)/lowest.txt -e . \
		"pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"
	$(LOWEST)/bin/python -m pip list --format=freeze > $(LOWEST)/installed.txt
	$(LOWEST)/bin/python -m pytest -m "not slow or lowest" $(PYTEST_ARGS) tests/rollout tests/learner \
		tests/protos tests/launch/test_local.py tests/launch/test_hyperparameters.py

# Benchmarks (not tests): tables on stdout, JSON and plots in bench/results/.
# make bench BENCH_ARGS=--quick for a two-minute smoke run.
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(PY) -m mypy -p hetrl

# The docs site (docs/, mkdocs.yml) into .site/; --strict fails on a broken link or anchor.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Rewrite every figure table in README.md and docs/ from bench/results/*.json.
tables: setup
	$(PY) -m bench.tables

protos: setup
	$(PY) -m hetrl.protos.generate

clean:
	rm -rf $(VENV) $(LOWEST) runs .site .pytest_cache .ruff_cache .mypy_cache
