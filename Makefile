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

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/simulator.py
	$(PY) benchmarks/incremental.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
