# acp-router: every target builds its own virtualenv from the project's files.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install demo test lint bench haproxy clean

$(BIN)/acp-router: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/acp-router

demo: install                ## start 3 reference agents and the router on ws://127.0.0.1:8765/acp
	$(BIN)/acp-router demo

lint: install                ## ruff, ruff format --check, mypy --strict, and the layer contracts
	$(BIN)/ruff check router tests bench
	$(BIN)/ruff format --check router tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint                   ## lint, then the test suite with the branch-coverage floor
	$(BIN)/pytest --cov --cov-report=term

bench: install               ## run the benchmarks (ratios against baselines measured in the same run)
	@command -v haproxy >/dev/null 2>&1 || $(MAKE) --no-print-directory haproxy \
		|| echo "bench: could not install haproxy; the bench skips its rows"
	$(BIN)/python -m bench

haproxy:                     ## HAProxy, the bench's reference hop (Debian package; needs root)
	apt-get install -y -qq haproxy >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq haproxy >/dev/null; }

clean:
	rm -rf $(VENV) .venv-* .mypy_cache .pytest_cache .ruff_cache .coverage .coverage.* htmlcov build dist
