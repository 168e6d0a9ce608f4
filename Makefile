# eBPF vTAP Lab: the three commands a newcomer needs (run as root).
#   make demo   set up, then build Testbed 1 and watch the vTAP mirror traffic
#   make test   set up, lint, then run the whole test suite against the real kernel
#   make lab    set up, then open JupyterLab on the notebooks (127.0.0.1 only; PORT=8890 to start elsewhere)
PY := .venv/bin/python

.PHONY: setup demo lint test test-hosts lab mutants cleanup
setup:
	@scripts/setup.sh

demo: setup
	$(PY) -m lab demo

# The linter and the formatter's check (ruff, configured in pyproject.toml) first:
# CI runs exactly this. `.venv/bin/ruff format .` rewrites what the check refuses.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# The lab on your own hosts (`python -m lab hosts`), tested on namespaces with sshd as hosts
# (tests/test_hosts.py; part of `make test` too): about five minutes on its own.
test-hosts: setup
	$(PY) -m pytest -n 0 tests/test_hosts.py $(PYTEST_ARGS)

lab: setup
	$(PY) -m lab jupyter $(if $(PORT),--port $(PORT))

# Does the suite fail when the code is wrong? One-line mutants of the programs,
# each run against the tests that cover it (about an hour; not part of `make test`).
mutants: setup
	$(PY) -m lab mutants $(if $(ONLY),--only $(ONLY))

# Remove leftovers of crashed runs (lab namespaces, vTAP filters).
cleanup:
	$(PY) -m lab cleanup
