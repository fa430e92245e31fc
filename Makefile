# The two commands of the README: `make demo` and `make test`. Each installs what it needs.
PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install demo test lint

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"

demo: install
	$(PY) -m kfuse demo

test: install
	$(PY) -m pytest -q -n 2 --durations=15 tests

lint:
	ruff check kfuse tests benchmarks
