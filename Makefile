# acp-router: every target builds its own virtualenv from the project's files.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

NPM    := $(shell command -v npm 2>/dev/null)
INTEROP := tests/interop/node_modules/.package-lock.json

.PHONY: install interop demo test test-compiled test-fast lint bench haproxy compose-test docker-tools clean

$(BIN)/acp-router: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# NATIVE=1 (the default): compile the per-frame modules with mypyc (router.native_build), in
# place; where that fails (no C compiler), say so and run the pure-Python modules.
NATIVE ?= 1
NATIVE_LOG := $(VENV)/native-build.log
PURE := ACP_ROUTER_PURE=1

install: $(BIN)/acp-router
ifeq ($(NATIVE),1)
	@$(BIN)/python -m router.native_build >$(NATIVE_LOG) 2>&1 && tail -n 1 $(NATIVE_LOG) || { \
		tail -n 5 $(NATIVE_LOG); \
		echo "install: the compiled build failed ($(NATIVE_LOG)): the router runs its Python sources"; }
endif

demo: install                ## start 3 reference agents and the router on ws://127.0.0.1:8765/acp
	$(BIN)/acp-router demo

# The official TypeScript SDK (and the JSON Schemas it ships) for the interop tests,
# pinned by tests/interop/package-lock.json. Without npm those tests skip, saying why.
ifneq ($(NPM),)
interop: $(INTEROP)           ## npm ci in tests/interop
$(INTEROP): tests/interop/package.json tests/interop/package-lock.json
	cd tests/interop && npm ci --no-audit --no-fund
	touch $@
else
interop:
	@echo "npm not found: the TypeScript SDK interop tests will skip"
endif

lint: install                ## ruff, ruff format --check, mypy --strict, and the layer contracts
	$(BIN)/ruff check router tests bench
	$(BIN)/ruff format --check router tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite twice: on the Python sources, where coverage sees every line (ACP_ROUTER_PURE=1,
# router.native), with the branch-coverage floor; then on the compiled modules, as users run them.
test: lint interop           ## lint, the suite on the sources (coverage floor), then compiled
	$(PURE) $(BIN)/pytest --cov --cov-report=term
	@$(MAKE) --no-print-directory test-compiled

test-compiled: install interop  ## the suite on the compiled modules make install built (where it could)
	@if $(BIN)/python -c "import router.native as n, sys; sys.exit(not n.COMPILED)"; then \
		echo "== the same suite on the compiled modules =="; $(BIN)/pytest -q; \
	else echo "test-compiled: no compiled build here: the suite ran on the Python sources only"; fi

test-fast: install           ## the core tests alone (tests/core: no sockets, no processes), in seconds
	$(BIN)/pytest tests/core -q -p no:cacheprovider

bench: install               ## run the benchmarks (ratios against baselines measured in the same run)
	@command -v haproxy >/dev/null 2>&1 || $(MAKE) --no-print-directory haproxy \
		|| echo "bench: could not install haproxy; the bench skips its rows"
	$(BIN)/python -m bench

haproxy:                     ## HAProxy, the bench's reference hop (Debian package; needs root)
	apt-get install -y -qq haproxy >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq haproxy >/dev/null; }

# The compose demo on a real Docker engine (tests/e2e/test_compose_engine.py): it starts
# dockerd when none runs, and builds a local stand-in for python:3.11-slim when that cannot
# be pulled. COMPOSE_TEST=require (.ci/run) fails where no engine can run instead of skipping.
COMPOSE_TEST ?= run
compose-test: install        ## docker-compose.yml on a Docker engine, driven as the README says
	@command -v dockerd >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1 \
		&& command -v mmdebstrap >/dev/null 2>&1 || $(MAKE) --no-print-directory docker-tools \
		|| echo "compose-test: could not install docker.io, docker-compose and mmdebstrap"
	ACP_ROUTER_COMPOSE_TEST=$(COMPOSE_TEST) $(BIN)/pytest tests/e2e/test_compose_engine.py \
		-s -p no:cacheprovider

docker-tools:                ## the Docker engine, Compose 1.29 and mmdebstrap (Debian packages; needs root)
	apt-get install -y -qq docker.io docker-compose mmdebstrap >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq docker.io docker-compose mmdebstrap >/dev/null; }

clean:
	rm -rf $(VENV) .venv-* router/native-*.stamp .mypy_cache .pytest_cache .ruff_cache .coverage .coverage.* htmlcov build dist tests/interop/node_modules
	find router -name '*.so' -delete
