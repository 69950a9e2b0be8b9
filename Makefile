# distrain workbench: every target sets itself up on a fresh machine.
#   make lab   - create .venv, install, open JupyterLab on the quickstart notebook
#   make demo  - run the quickstart headless; executed notebook under runs/
#   make test  - create .venv if missing, run `make lint`, then the whole suite
#   make test-fast - the pure-logic tests only (no processes, under a minute)
#   make lint  - ruff check + ruff format --check (settings in pyproject.toml)
#   make labs  - write the labs' student versions to labs/student/
#   make docs  - the documentation and course site into docs/_build/html
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE := $(CURDIR)/.state
# torch: the CPU wheel on machines without a GPU (never a multi-GB CUDA build by accident)
TORCH_SPEC ?= torch==2.13.0
export IPYTHONDIR := $(STATE)/ipython
export JUPYTER_RUNTIME_DIR := $(STATE)/jupyter/runtime
export JUPYTER_CONFIG_DIR := $(STATE)/jupyter/config
export JUPYTER_DATA_DIR := $(STATE)/jupyter/data

.PHONY: lab demo test test-fast lint bench clean labs docs gpu-wheels gpu-check

# The JupyterLab extension: npm packages from the registry, built against this venv's
# JupyterLab, output in workbench/labextension/ (a wheel carries it under share/jupyter; the
# wheel build runs the same npm build itself, see docs/install.md).
LABEXT := workbench/labextension/package.json
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/distrain-workbench-lab
$(LABEXT): extensions/package.json extensions/package-lock.json extensions/tsconfig.json $(wildcard extensions/src/*.ts extensions/style/*)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "jupyterlab>=4,<5"
	cd extensions && npm ci --no-audit --no-fund && PATH="$(CURDIR)/$(BIN):$$PATH" npm run build

$(BIN)/.installed: pyproject.toml $(LABEXT)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	# the editable install copies the Lab extension into the venv, and would delete through
	# the develop link below, into workbench/labextension, what it replaces: drop the link first
	if [ -L $(LABEXT_LINK) ]; then rm $(LABEXT_LINK); fi
	$(BIN)/pip install -q -e ".[test,parquet,mpi,hf,docs,ft,fp8,jax,ray,tensorboard,mlflow,wandb,trackio]"
	# DeepSpeed builds against the torch above; build isolation would fetch another torch
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation "deepspeed>=0.15"
	# Both extensions live in the venv (sys-prefix), which Jupyter searches whatever the
	# JUPYTER_*_DIR say, so `make lab` and the tests (JUPYTER_* folders of their own) see the
	# same ones: the server extension's switch in $(VENV)/etc/jupyter (written by the install
	# above), and the Lab extension linked to this tree's build (so a rebuild shows on reload).
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter labextension develop --overwrite .
	touch $@

$(STATE):
	mkdir -p $(IPYTHONDIR) $(JUPYTER_RUNTIME_DIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR)

lab: $(BIN)/.installed | $(STATE)
	$(BIN)/jupyter lab notebooks/00_quickstart.ipynb $(if $(filter 0,$(shell id -u)),--allow-root,)

demo: $(BIN)/.installed | $(STATE)
	$(BIN)/python -m workbench.notebook.demo notebooks/00_quickstart.ipynb --out runs

# The suite runs one pytest process per group (a tier folder; tests/ranks in five by file
# name; any test file still at the top of tests/), each with rank sets of its own, so that no
# group inherits another's ranks. Each group keeps 0.9-1.7 of the 2 cores a CI runner has busy, so
# two streams of rank groups side by side finish before the groups one after another (~8.5 min
# each here). The notebook tier (a kernel, and its ranks, started per notebook: 2-3 processes
# starting at once, the most start-heavy group), the test files whose checks allow a second or
# a few (a rank's death named at once, no orphan after 3 s, a cut at a timeout, a hang named within its timeout + 2 s), the browser and
# the cluster tiers then run one after another with nothing beside them. tests/run_streams.py prints each group's log whole when it ends and a table
# of every group at the end; every group runs, and the target fails if any group failed.
TEST_LOGS := $(STATE)/test-logs
RANKS_TIMED := $(patsubst %,tests/ranks/test_%.py,failures health orphans rank_lifecycle culprit)
NOTEBOOKS_TIMED := $(patsubst %,tests/notebooks/test_%.py,cells_kernel gpu_check)
# 64 real ranks: the most the machine holds, so nothing runs beside them
RANKS_64 := tests/ranks/test_scale_64.py
UNTIMED := $(addprefix !,$(RANKS_TIMED) $(NOTEBOOKS_TIMED) $(RANKS_64))
# detach's kernels and keepers (~6 min) run in the first stream: a-f alone was the longest group
RANKS_DETACH := tests/ranks/test_detach.py
# and the dry runs (~3 min: 512 ranks' positions on fake tensors, and the 8 live ranks beside them)
RANKS_DRY := tests/ranks/test_dry_run.py tests/ranks/test_dry_run_live.py
TEST_STREAM_1 := unit=tests/unit,gpu=tests/gpu,top=tests/test_*.py,ranks-l=tests/ranks/test_l*.py,install=tests/install,\
	ranks-g-k=tests/ranks/test_[g-k]*.py $(UNTIMED),ranks-m-p=tests/ranks/test_[m-p]*.py $(UNTIMED),ranks-detach=$(RANKS_DETACH),\
	ranks-dry=$(RANKS_DRY)
TEST_STREAM_2 := ranks-a-f=tests/ranks/test_[a-f]*.py $(UNTIMED) !$(RANKS_DETACH) $(addprefix !,$(RANKS_DRY)),\
	ranks-q-z=tests/ranks/test_[q-z]*.py $(UNTIMED)
# One pytest process across tiers, as a contributor selects tests: a test that leaves a session,
# a rank set or a process behind for the next one (hidden by one process per tier) fails here.
TEST_MIXED := tests/unit/test_boundaries.py::test_import_workbench_alone_loads_nothing_but_the_package tests/ranks/test_flag_walk.py::test_named_set_flags \
	tests/ranks/test_sessions.py::test_two_named_sets_train_side_by_side_and_one_stops_while_the_other_trains \
	tests/cluster/test_ssh.py::test_sigkill_on_the_other_host_is_named_with_host_and_exit_within_2s \
	tests/cluster/test_ssh.py::test_notebook_killed_leaves_no_rank_on_either_host tests/browser/test_lab_installed.py
TEST_ALONE := notebooks=tests/notebooks $(UNTIMED),ranks-timed=$(RANKS_TIMED),notebooks-timed=$(NOTEBOOKS_TIMED),\
	ranks-64=$(RANKS_64),browser=tests/browser,cluster=tests/cluster,mixed=$(TEST_MIXED)
# DeepSpeed's async I/O op (ZeRO-Infinity's NVMe offload; needs libaio-dev) is compiled on first
# use: built once here, alone on the cores (~4 min on 2), into the folder the tests use
# (tests/conftest.py), not inside a test group with others beside it (20+ min there); with the
# ninja the ranks use (the venv's: another ninja reads the build log as changed and rebuilds)
DS_AIO := $(STATE)/torch_extensions/async_io/async_io.so
$(DS_AIO): | $(BIN)/.installed $(STATE)
	TORCH_EXTENSIONS_DIR=$(STATE)/torch_extensions DS_ACCELERATOR=cpu $(BIN)/python -c \
		"from workbench.strategies.zero import ninja_beside_python; ninja_beside_python(); \
		from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()"

test: lint $(DS_AIO) | $(STATE)
	$(BIN)/python tests/run_streams.py $(TEST_LOGS) "$(TEST_STREAM_1)" "$(TEST_STREAM_2)" --then "$(TEST_ALONE)"

# Pure logic only (tests/unit, marked `pure`): no ranks, kernels or browser; under a minute.
# Two workers: a third of its time is waits (a guard's silence, a view's timeout) and imports
# (every rank-side module, transformers) that keep one core busy while the other is idle.
test-fast: $(BIN)/.installed | $(STATE)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m pure -n 2 --dist worksteal tests/unit

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
# Student versions of the labs (solutions blanked, checks kept) in labs/student/, and
# instructor copies without outputs in labs/instructor/; see docs/instructors.md.
labs: $(BIN)/.installed
	$(BIN)/python -m workbench.labs.build --src notebooks --out labs

# The documentation and course site (docs/: Sphinx + MyST-NB) into docs/_build/html (git-ignored);
# -W: a broken link between pages fails the build. The notebooks come executed from the suite's
# runs (.state/executed-notebooks/, written by `make test`); a missing one is executed here
# (DOCS_EXECUTE=none renders it unexecuted instead). tests/browser/test_docs_site.py builds it too.
docs: $(BIN)/.installed | $(STATE)
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "the site: docs/_build/html/index.html"

# The start-up benchmark's other tool, in a venv of its own; torch comes from ours by a .pth
# placed after its own packages (see benchmarks/startup_bench.py)
JD := $(STATE)/jd/venv
$(JD)/.installed: $(BIN)/.installed | $(STATE)
	python3 -m venv $(JD)
	$(JD)/bin/pip install -q jupyter-distributed
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(JD)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_shared_torch.pth"
	touch $@

bench: $(BIN)/.installed $(JD)/.installed | $(STATE)
	failed=; for b in benchmarks/*_bench.py; do OMP_NUM_THREADS=1 $(BIN)/python $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "make bench: missed a target or failed:$$failed"; exit 1; fi

# GPU check: `make gpu-wheels` here (network) fetches what the GPU machine lacks into .whl/
# (git-ignored; carried to it); `make gpu-check` there runs the -m gpu tests, report into $$OUT.
GPU_PIP_TARGET := --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
# the venv is set up where there is none; an existing one is used as it is (its versions are the wheels')
gpu-wheels: $(if $(wildcard $(BIN)/python),,$(BIN)/.installed)
	rm -rf .whl && mkdir -p .whl $(STATE)
	$(BIN)/python gpu/wheels.py | grep -v '^deepspeed==' > $(STATE)/gpu-wheels.txt
	$(BIN)/pip download -q $(GPU_PIP_TARGET) -d .whl -r $(STATE)/gpu-wheels.txt
	# DeepSpeed publishes no wheel: a pure-Python one (no prebuilt ops) built against this torch
	DS_BUILD_OPS=0 $(BIN)/pip wheel -q --no-deps --no-build-isolation -w .whl "$$($(BIN)/python gpu/wheels.py | grep '^deepspeed==')"
	du -sh .whl

GPU_PY ?= python3
gpu-check:
	$(GPU_PY) gpu/check.py

clean:
	rm -rf $(VENV) $(STATE) runs docs/_build docs/course/notebooks docs/api/magics.md
