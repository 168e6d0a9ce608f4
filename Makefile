# eBPF vTAP Lab: the two commands a newcomer needs (run as root).
#   make demo   set up, then build Testbed 1 and watch the vTAP mirror traffic
#   make test   set up, then run the whole test suite against the real kernel
PY := .venv/bin/python

.PHONY: setup demo test cleanup
setup:
	@scripts/setup.sh

demo: setup
	$(PY) -m lab demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Remove leftovers of crashed runs (lab namespaces, vTAP filters).
cleanup:
	$(PY) -m lab cleanup
