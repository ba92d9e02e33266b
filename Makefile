# Thin wrappers; every recipe is a command you can also type yourself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INVENTORY ?= inventory/rehearsal
# The CPU build of torch that the kernel tests (pd_kernels, installed editable from kernels/) run under
# the Triton interpreter.
KERNEL_TEST_DEPS ?= torch==2.13.0 triton==3.9.0
# Pinned wheels the tests install or patch for real (downloaded once from PyPI or PIP_INDEX_URL).
WHEEL_DIR ?= artifacts/wheels
SGLANG_WHEEL := $(WHEEL_DIR)/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
# A rehearsal's filter plugins: the product's (all ansible.cfg names) and the stand-ins', which the
# rehearsal overlay builds its simulated GPUs with. Only a rehearsal inventory gets them.
REHEARSAL_FILTER_PLUGINS := $(CURDIR)/plugins/filter:$(CURDIR)/standins/plugins/filter

.PHONY: venv system rehearse stop deploy test lint syntax pytest molecule molecule-multinode molecule-driver molecule-scenarios wheels sglang-parser clean

venv: $(BIN)/.pd-installed

# uv installs the venv (measured on this machine kind: 15 s against pip's 168 s), from the sources
# pip is configured with (src/pd_appliance/supply/pip_sources.py reads `pip config list`). Byte-compiled,
# with the checkout's own Python: where PYTHONDONTWRITEBYTECODE is set (this machine kind's image sets
# it), nothing else ever writes a .pyc, and every ansible-playbook, module and test process compiles
# what it imports again (ansible's imports: 1.2 s without, 0.6 s with; the no-op re-run: 96 s -> 83 s).
UV_VERSION ?= 0.13.9
$(BIN)/.pd-installed: pyproject.toml kernels/pyproject.toml standins/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	  $$($(BIN)/python src/pd_appliance/supply/pip_sources.py) -e '.[dev]' -e ./kernels -e ./standins $(KERNEL_TEST_DEPS)
	$(BIN)/python -m compileall -q -j 0 src kernels/src plugins standins tests > /dev/null
	touch $@

# The main job on the embedded default: site.yml against the rehearsal inventory.
rehearse stop: export ANSIBLE_FILTER_PLUGINS = $(REHEARSAL_FILTER_PLUGINS)
deploy: export ANSIBLE_FILTER_PLUGINS = $(if $(findstring rehearsal,$(INVENTORY)),$(REHEARSAL_FILTER_PLUGINS),$(CURDIR)/plugins/filter)
rehearse: venv
	$(BIN)/ansible-playbook standins/prepare.yml -i $(INVENTORY)
	$(BIN)/pd-appliance deploy -i $(INVENTORY)

# Stop the rehearsal: supervisord and its programs, then the stand-ins (a no-op when nothing runs).
stop:
	@if [ -x $(BIN)/ansible-playbook ]; then \
	  $(BIN)/ansible-playbook playbooks/day2/stop.yml -i $(INVENTORY) && \
	  $(BIN)/ansible-playbook standins/cleanup.yml -i $(INVENTORY); fi

deploy: venv
	$(BIN)/pd-appliance deploy -i $(INVENTORY)

# The pinned sglang and NIXL wheels (the patch-series and lock tests read them), downloaded against
# the lock's sha256 hashes for Python 3.11 (files/locks/README.md).
SGLANG_LOCK := files/locks/sglang-0.5.23/py3.11-x86_64.txt
wheels: venv
	@mkdir -p $(WHEEL_DIR)
	@if ! test -f $(SGLANG_WHEEL) || ! ls $(WHEEL_DIR)/nixl_cu13-1.5.1-*.whl $(WHEEL_DIR)/nixl-1.5.1-*.whl >/dev/null 2>&1; then \
	  $(BIN)/python -c "import sys; from pathlib import Path; from pd_appliance.supply import lock; \
	    sys.stdout.write(lock.render(lock.read_lock(Path('$(SGLANG_LOCK)')), ['sglang', 'nixl-cu13', 'nixl']))" \
	    > $(WHEEL_DIR)/pinned.txt && \
	  $(BIN)/pip download -q --no-deps --require-hashes --only-binary=:all: --implementation cp --python-version 3.11 \
	    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 -d $(WHEEL_DIR) -r $(WHEEL_DIR)/pinned.txt; fi

# SGLang's own command-line parser: a venv with the pinned wheel (patched like the lab's) and only
# what its parser imports (CPU torch), cached under artifacts/sglang-parser by its inputs. The
# tests that need it (tests/sglang/test_server_args.py) build it on first use; this builds it ahead.
sglang-parser: venv wheels
	$(BIN)/python -m pd_appliance.sglang_args venv --wheel $(SGLANG_WHEEL)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint -q
	$(BIN)/mypy

syntax: venv
	$(BIN)/ansible-playbook --syntax-check site.yml -i inventory/rehearsal
	$(BIN)/ansible-playbook --syntax-check site.yml -i inventory/lab

# Two workers, a group of files each (--dist loadfile; tests/conftest.py's scheduler hands the files
# sharing one converged rehearsal to one worker together): a file's module-scoped deployment stays
# on one worker. The rehearsal tests spend much of their time waiting on programs, so two share 2
# cores well. --no-loadscope-reorder keeps the order tests/conftest.py sets (longest groups first;
# xdist would otherwise order them by their number of tests). PYTEST_WORKERS=0 runs serially.
# PD_FAIL_ON_UNDECLARED_SKIP=1: a skip not declared in tests/declared_skips.yml fails the run
# (tests/skip_gate.py), so a missing system package, wheel or dockerd cannot turn tests into skips.
PYTEST_WORKERS ?= 2
pytest: venv wheels
	PD_FAIL_ON_UNDECLARED_SKIP=1 PD_SGLANG_WHEEL=$(abspath $(SGLANG_WHEEL)) PD_WHEEL_DIR=$(abspath $(WHEEL_DIR)) $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

molecule: venv
	PATH=$(abspath $(BIN)):$$PATH $(PYTHON) scripts/elapsed.py --label default $(BIN)/molecule test -s default

molecule-multinode: venv
	PATH=$(abspath $(BIN)):$$PATH $(PYTHON) scripts/elapsed.py --label multinode $(BIN)/molecule test -s multinode

molecule-driver: venv
	PATH=$(abspath $(BIN)):$$PATH $(PYTHON) scripts/elapsed.py --label driver $(BIN)/molecule test -s driver

# Every molecule scenario at once: each has its own lab network, containers, stand-in ports and SSH
# control sockets. One scenario keeps about one core busy (ansible runs one task at a time), so on
# CI's two cores the three share them instead of waiting for each other (docs/molecule.md). Their
# lines interleave as they come, each labelled with its scenario and elapsed seconds (make's
# --output-sync would hold a scenario's whole output until it ends).
molecule-scenarios: venv
	$(MAKE) --no-print-directory -j3 molecule molecule-driver molecule-multinode

# System packages the tests need: installed as root, else checked and named (scripts/system-packages.sh).
system:
	scripts/system-packages.sh

# The README's test command and CI's: system packages, lint, syntax, the unit + integration tests,
# then every molecule scenario (default, driver, multinode) at once: CI's two cores are busy all
# through pytest, so molecule runs after it, not beside it (docs/molecule.md).
test:
	@scripts/timed-targets.sh system venv wheels sglang-parser lint syntax pytest molecule-scenarios

clean: stop
	rm -rf .rehearsal artifacts/runs
