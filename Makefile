# Two commands do all the set-up on a fresh Debian/Ubuntu machine with Python 3.11+:
#   make demo   -- the main job, on the embedded defaults
#   make test   -- the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test redis venv bench mutants clean image control-plane

# redis-server comes from Debian's package (see docs/embedded-broker.md for why).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  echo "installing redis-server (Debian package)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@# Dynamo's own replay, the simulator's reference peer (tests/sim/test_sim_peer.py); optional:
	@# where the wheel cannot be had, those tests skip and nothing else changes.
	$(BIN)/pip install -q -e '.[test,peer]' || echo "ai-dynamo-runtime (the [peer] extra) not installed; peer tests skip"
	touch $(STAMP)

venv: $(STAMP)

demo: redis venv
	$(BIN)/powerfleet demo

# The control_plane tier (tests/control_plane; docs/twin.md, "Real control plane") runs against a
# real etcd, kube-apiserver, scheduler, controller-manager, kwok and helm, built from Go modules
# first where Go is there (once: cached outside the tree, ~/.cache/powerfleet/control-plane).
# Where they cannot be built the tier is skipped with one line and the rest of the suite runs.
# The suite runs on TEST_WORKERS pytest-xdist workers (default: one per core), each test file whole
# on one worker, the control_plane tier on one, the demos one after another (tests/conftest.py).
# TEST_WORKERS=0 runs it in one process; docs/benchmarks.md, "The test suite", has the figures.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: redis venv
	@if bash controlplane/build.sh --tier >/dev/null; then \
	  $(PYTEST) tests; \
	else \
	  $(PYTEST) tests -m "not control_plane"; \
	fi

# Build the control plane's binaries (a no-op when they are built; without Go it says so).
control-plane:
	@bash controlplane/build.sh

bench: redis venv
	$(BIN)/python bench/dispatch.py
	$(BIN)/python bench/sim.py
	$(BIN)/python bench/budget.py

# The mutation check (bench/mutants.py; docs/benchmarks.md): plants each bug of a fixed list in
# a copy of the tree and runs its tests. Not part of `make test`. Narrow it with
#   make mutants MUTANTS_ARGS="--only 'planner.*' s4.group_share_ignores_own_limit"
mutants: redis venv
	$(BIN)/python bench/mutants.py $(MUTANTS_ARGS)

# The container image (Dockerfile): the unit tests run inside it first (target test), then the
# runtime image is tagged. Needs Docker with BuildKit.
IMAGE ?= powerfleet:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	docker build --target test -t $(IMAGE)-test .
	docker build --target runtime -t $(IMAGE) .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
