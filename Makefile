# Everything a fresh machine needs: `make demo` and `make test` create the venv themselves. One
# .venv, a stamp per set of extras: the demo installs the package and matplotlib (plots), the
# tests the test extra and plots, screenshots nbconvert (docs) besides. Neither undoes another,
# and each installs again only when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CREATED := $(VENV)/.created
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo test lint check bench bench-ci screenshots clean

$(CREATED):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

$(DEMO_STAMP): EXTRAS := plots
$(TEST_STAMP): EXTRAS := test,plots
$(DOCS_STAMP): EXTRAS := test,plots,docs
$(DEMO_STAMP) $(TEST_STAMP) $(DOCS_STAMP): pyproject.toml | $(CREATED)
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

demo: $(DEMO_STAMP)
	$(PY) -m batchjson demo

lint: $(TEST_STAMP)  # ruff, then the layers and no import circle (pyproject.toml's importlinter)
	$(PY) -m ruff check src tests benchmarks tools
	$(VENV)/bin/lint-imports

test: $(TEST_STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg
	$(PY) tools/mutants.py

# Hand mutations of _acceptance/judge.py and _session/accounts.py in a temporary copy
# (tools/mutants.py says which); fails if the suite lets one survive. About 20 s, so
# `make test` runs it too.
check: $(TEST_STAMP)
	$(PY) tools/mutants.py

bench: $(TEST_STAMP)  # every benchmark runs and prints its verdict; fails if any target was missed
# (bench_scale at 200,000 tasks: BATCHJSON_BENCH_SCALE_N=1000000 make bench for the full 1M,
# BATCHJSON_BENCH_SCALE_N=10000000 for the 10M streamed from a generator)
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
	$(PY) benchmarks/bench_accept.py || status=1; \
	exit $$status

# The few-minute subset CI runs after `make test` (.ci/run): small sizes, each target a ratio to
# its floor measured in the same run, margins for a loaded 2-core machine (benchmarks/_common.py)
bench-ci: $(TEST_STAMP)
	@status=0; export BATCHJSON_BENCH_CI=1; \
	$(PY) benchmarks/bench_fingerprint.py || status=1; \
	$(PY) benchmarks/bench_judging.py || status=1; \
	$(PY) benchmarks/bench_throughput.py || status=1; \
	$(PY) benchmarks/bench_throughput.py --n 384 --latency 1 || status=1; \
	$(PY) benchmarks/bench_ratelimits.py || status=1; \
	$(PY) benchmarks/bench_hosts.py || status=1; \
	$(PY) benchmarks/bench_scale.py || status=1; \
	exit $$status

# Each notebook run as a reader runs it, rendered to HTML and photographed by headless Chromium
# (tools/screenshots.py): build/screenshots/NAME.png, to look at before calling a display done.
CHROMIUM ?= $(firstword $(shell command -v chromium chromium-browser google-chrome 2>/dev/null))

screenshots:  # said before the install: Chromium is the system's, not a Python package
	@test -n "$(CHROMIUM)" || { echo "make screenshots needs Chromium: sudo apt-get install" \
		"chromium (Debian, Ubuntu), brew install --cask chromium (macOS), or" \
		"CHROMIUM=/path/to/chrome make screenshots"; exit 2; }
	@$(MAKE) -s --no-print-directory $(DOCS_STAMP)
	CHROMIUM='$(CHROMIUM)' $(PY) tools/screenshots.py

clean:
	rm -rf $(VENV) .batchjson .pytest_cache .import_linter_cache build
