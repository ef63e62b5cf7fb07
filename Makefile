# deviceshare — every target creates the virtualenv it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# pytest-xdist workers for `make test` and `make test-stress`: CI's 2 cores. TEST_WORKERS=0 runs the suite in
# one process (as plain `pytest` does).
TEST_WORKERS ?= 2
STAMP  := $(VENV)/.installed

.PHONY: help venv test test-stress lint helm manifests demo sandbox bench soak e2e image clean monitoring

help:
	@echo "make demo   - sandbox cluster + operator + webhook, shows groups bound with their devices"
	@echo "make test   - lint, type-check and the whole test suite on 2 pytest-xdist workers (TEST_WORKERS=0: one process)"
	@echo "make test-stress - the suite 3x with every core busy (CPU hog), 3x on one core; ~30 min, not in CI"
	@echo "make bench  - benchmarks; writes docs/benchmarks.md"
	@echo "make soak   - 30 minutes of churn against the sandbox"
	@echo "make e2e    - tests against a real cluster (needs KUBECONFIG)"
	@echo "make image  - container image (needs Docker)"
	@echo "make manifests - re-render the kustomize base from charts/deviceshare (after a template change)"
	@echo "make monitoring - rebuild monitoring/dashboards/*.json and monitoring/manifests from their sources"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,sandbox]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks monitoring
	$(BIN)/mypy
	$(BIN)/lint-imports

# The pinned Helm 4 the chart tests use (tests/charts/helm_binary.py): fetched once, hash-checked, cached.
helm: $(STAMP)
	@$(BIN)/python -m tests.charts.helm_binary

manifests: helm
	$(BIN)/python -m tests.charts.rendering

test: lint helm
	@$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests - that is a failure" >&2; fi; \
	exit $$rc

# Not run by .ci/run: six whole-suite runs on a slowed machine take ~30 min on 2 cores; CI stays under ~10.
test-stress: helm
	PYTHON=$(BIN)/python TEST_WORKERS=$(TEST_WORKERS) .ci/stress

monitoring: $(STAMP)
	$(BIN)/python -m monitoring

demo: $(STAMP)
	$(BIN)/deviceshare demo

sandbox: $(STAMP)
	$(BIN)/deviceshare sandbox

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests -p no:cacheprovider $(PYTEST_ARGS)

e2e: $(STAMP)
	@test -n "$$KUBECONFIG" || (echo "make e2e needs KUBECONFIG pointing at a real cluster" && exit 2)
	$(BIN)/python -m pytest -q -m e2e tests

image:
	docker build -t deviceshare:dev .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache .sandbox
