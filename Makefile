# aenv — two commands on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_STAMP := /var/lib/aenv-dev/.system-deps
GEN := src/aenv/envd/gen
PYTEST_ARGS ?=
# make test: the suite as TEST_SHARDS pytest processes side by side (tests/shards.py).
export TEST_SHARDS ?= 3

.PHONY: run run-envd test bench lint gen deps system-deps bundle clean

# Install what is missing, then serve on the embedded defaults (SQLite, posix storage, gVisor):
# AENV_HOME=/var/lib/aenv, AENV_LISTEN=127.0.0.1:3000. The first start builds the envd bundle
# and the Debian base template (about a minute, with progress).
run: deps
	$(BIN)/aenv server

# envd alone, in a throwaway bubblewrap root on 127.0.0.1:49983 (for the SDK's debug mode).
run-envd: deps bundle
	$(BIN)/python -m tests.envd.harness serve --port $${AENV_ENVD_PORT:-49983}

test: deps
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m tests.shards $(PYTEST_ARGS)

# envd alone (bubblewrap), then the node server with real gVisor sandboxes (needs root), then
# the sandbox lifecycle: create from template, pause/resume, snapshot, fork (15-20 min here).
bench: deps bundle
	$(BIN)/python -m bench.envd_bench
	$(BIN)/python -m bench.node_bench
	$(BIN)/python -m bench.lifecycle_bench
	$(BIN)/python -m bench.images_bench
	$(BIN)/python -m bench.repository_bench
	$(BIN)/python -m bench.workspace_bench
	$(BIN)/python -m bench.proxy_bench
	$(BIN)/python -m bench.auth_bench
	$(BIN)/python -m bench.observe_bench
	$(BIN)/python -m bench.waves_bench
	$(BIN)/python -m bench.demand_bench
	$(BIN)/python -m bench.ksm_bench --svg docs/img/density.svg
	$(BIN)/python -m bench.egress_bench
	$(BIN)/python -m bench.burst_bench
	$(BIN)/python -m bench.cluster
	$(BIN)/python -m bench.rl_bench --svg docs/img/rl.svg
	$(BIN)/python -m bench.interpreter
	$(BIN)/python -m bench.torture --minutes 30 --sandboxes 50

lint: deps
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

deps: system-deps $(STAMP)

system-deps:
	@bash scripts/install-system-deps.sh

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

bundle: deps
	$(BIN)/aenv envd bundle --out build/envd-bundle

# Regenerate envd's wire code from the .proto files (committed; never edited by hand).
gen: $(STAMP)
	rm -f $(GEN)/*_pb.py $(GEN)/*_connect.py
	$(BIN)/python -m grpc_tools.protoc -Iproto \
	  --plugin=protoc-gen-py=$(BIN)/protoc-gen-py \
	  --plugin=protoc-gen-connectrpc=$(BIN)/protoc-gen-connectrpc \
	  --py_out=$(GEN) --connectrpc_out=$(GEN) proto/process.proto proto/filesystem.proto

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
