# Quick start on a fresh machine: `make demo`, then `make test`.
# Both create .venv and install placetool (with its TensorFlow and OR-Tools extras) into it on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tf,exact,dev]'
	touch $(STAMP)

install: $(STAMP)

# The main job: an RL policy places the default graph (synthetic-1k on k80x4) in about
# two minutes, printed beside the single-device and expert baselines.
demo: $(STAMP)
	$(VENV)/bin/placetool search --method rl --compare

# Most tests wait on TensorFlow start-ups, subprocesses and compiles, so two workers
# halve the suite's wall time on 2 cores. Whole files go to one worker: their
# module fixtures (a testbed, a built wheel, a sweep's store) are made once.
# At most 4 workers, as each loads TensorFlow (only 2 were timed); `TEST_JOBS=0` runs
# the suite in this process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/simulator.py
	$(PY) benchmarks/incremental.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
