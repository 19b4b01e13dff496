# Everything a fresh machine needs: `make demo` and `make test` create the venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m batchjson demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

test: $(STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks --nbval --nbval-current-env

bench: $(STAMP)
	$(PY) benchmarks/bench_fingerprint.py
	$(PY) benchmarks/bench_throughput.py

clean:
	rm -rf $(VENV) .batchjson .pytest_cache
