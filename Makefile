# Everything a fresh machine needs: `make demo` and `make test` create the venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint check bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m batchjson demo

lint: $(STAMP)  # ruff, then the layers and no import circle (pyproject.toml's importlinter)
	$(PY) -m ruff check src tests benchmarks tools
	$(VENV)/bin/lint-imports

test: $(STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg
	$(PY) tools/mutants.py

# Hand mutations of _acceptance/judge.py and _session/accounts.py in a temporary copy
# (tools/mutants.py says which); fails if the suite lets one survive. About 20 s, so
# `make test` runs it too.
check: $(STAMP)
	$(PY) tools/mutants.py

bench: $(STAMP)  # every benchmark runs and prints its verdict; fails if any target was missed
# (bench_scale at 200,000 tasks: BATCHJSON_BENCH_SCALE_N=1000000 make bench for the full 1M)
	@status=0; \
	$(PY) benchmarks/bench_fingerprint.py || status=1; \
	$(PY) benchmarks/bench_judging.py || status=1; \
	$(PY) benchmarks/bench_throughput.py || status=1; \
	$(PY) benchmarks/bench_throughput.py --n 640 --latency 1 --rounds 3 || status=1; \
	$(PY) benchmarks/bench_ratelimits.py || status=1; \
	$(PY) benchmarks/bench_hosts.py || status=1; \
	BATCHJSON_BENCH_SCALE_N=$${BATCHJSON_BENCH_SCALE_N:-200000} \
		$(PY) benchmarks/bench_scale.py || status=1; \
	$(PY) benchmarks/bench_batch_scale.py || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .batchjson .pytest_cache .import_linter_cache
