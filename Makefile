# Thin wrappers; every recipe is a command you can also type yourself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INVENTORY ?= inventory/rehearsal
# The CPU build of torch that the kernel tests run under the Triton interpreter.
KERNEL_TEST_DEPS ?= torch==2.13.0 triton==3.9.0
SGLANG_WHEEL_DIR ?= .cache/wheels

.PHONY: venv rehearse deploy test lint syntax pytest molecule molecule-multinode sglang-wheel clean

venv: $(BIN)/.pd-installed

$(BIN)/.pd-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q $(KERNEL_TEST_DEPS)
	touch $@

# The main job on the embedded default: site.yml against the rehearsal inventory.
rehearse: venv
	$(BIN)/pd-appliance deploy -i $(INVENTORY)

deploy: venv
	$(BIN)/pd-appliance deploy -i $(INVENTORY)

# The pinned SGLang wheel the patch-series tests apply to (downloaded once, from PyPI or PIP_INDEX_URL).
sglang-wheel: venv
	@ls $(SGLANG_WHEEL_DIR)/sglang-0.5.23-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download -q --no-deps sglang==0.5.23 -d $(SGLANG_WHEEL_DIR)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint -q

syntax: venv
	$(BIN)/ansible-playbook --syntax-check site.yml -i inventory/rehearsal
	$(BIN)/ansible-playbook --syntax-check site.yml -i inventory/lab

pytest: venv sglang-wheel
	PD_SGLANG_WHEEL_DIR=$(SGLANG_WHEEL_DIR) $(BIN)/pytest -q

molecule: venv
	cd molecule/.. && PATH=$(abspath $(BIN)):$$PATH $(BIN)/molecule test -s default

molecule-multinode: venv
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/molecule test -s multinode

# The README's test command: lint, syntax, unit + integration tests, molecule rehearsal scenario.
test: lint syntax pytest molecule

clean:
	rm -rf .rehearsal artifacts/runs
