# rocm-train-operator: every entry point a person or CI needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
export GOFLAGS ?= -buildvcs=false
JOB ?= examples/quickstart.yaml
# mypy's incremental cache, shared by the machine's checkouts as Go's build cache is: mypy reuses an entry
# only for the same mypy version and options, and a file whose mtime differs only if its hash matches
# (a fresh clone checks in 4 s instead of 64).
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rocm-train-operator/mypy

.PHONY: install lock quickstart run test test-unit lint format crds docs manifests render validate \
        deps cluster-binaries cluster-up cluster-down demo run-operator bench bench-train bench-lm bench-operator bench-world \
        bench-checkpoint bench-flood clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Installs the project with every extra into .venv, at the versions of constraints.txt (the lock
# both Dockerfiles use too), and the test world (tests/testworld: the package rocmtrain_testworld);
# re-runs only when a pyproject or the lock changes. pip byte-compiles what it installs: where
# PYTHONDONTWRITEBYTECODE is set (as on the project's machine), Python never caches what it compiles, and
# every process (each Ray worker too) would compile its imports again.
$(VENV)/.installed: pyproject.toml tests/testworld/pyproject.toml constraints.txt | $(BIN)/activate
	$(PY) -m pip install --quiet --constraint constraints.txt -e '.[operator,train,plot,dev]' -e tests/testworld
	touch $@

install: $(VENV)/.installed

# Regenerates the lock from .venv after a change of pyproject.toml (see the header of constraints.txt).
# torch, and what only torch needs, stay unpinned: the ROCm base image's or a local CPU wheel is used.
UNPINNED := '^(torch|torchvision|torchaudio|triton|pytorch-triton-rocm|sympy|networkx|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)=='
lock: install
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -viE $(UNPINNED); } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# The README's quick start: install, then fine-tune MiniLM locally on CPU with an embedded Ray.
quickstart: install
	$(BIN)/rocmtrain run $(JOB) --summary runs/quickstart-summary.json

run: quickstart

# The README's test command: installs everything (Python deps, Go-built control plane), lints, then
# runs the tests in two pytest sessions at once (docs/development/tests.md#two-sessions-at-once): the
# training tests on an embedded Ray and then the end-to-end ones, bound by CPU, in the foreground;
# beside them every other test, which mostly waits on its control plane, with its report printed when
# both have ended. Each session prints its 25 slowest tests; the status fails if either does.
OTHER_TESTS := --ignore=tests/train --ignore=tests/e2e tests
test: deps
	@others=$$(mktemp); start=$$SECONDS; \
	$(BIN)/pytest -q -ra --durations=25 -p no:cacheprovider $(OTHER_TESTS) > "$$others" 2>&1 & beside=$$!; \
	$(BIN)/pytest -q -ra --durations=25 tests/train tests/e2e; ray=$$?; \
	wait $$beside; rest=$$?; \
	echo "======== beside them: the other tests ========"; cat "$$others"; rm -f "$$others"; \
	took=$$((SECONDS - start)); \
	echo "make test: both sessions took $$((took / 60)) min $$((took % 60)) s; exit status $$ray and $$rest"; \
	[ $$ray -eq 0 ] && [ $$rest -eq 0 ]

# The Go-built control plane beside the Python side (install, then lint): pip waits on the network and
# the disk, and mypy takes one core, while Go compiles on both.
deps:
	$(MAKE) -j2 lint cluster-binaries

test-unit: install
	$(BIN)/pytest -q -ra -m "not cluster and not ray"

# ruff, then mypy (strict on rocmtrain.api, rocmtrain.render and the pure status modules; see pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --cache-dir "$(MYPY_CACHE)"

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

crds: install
	$(PY) -m rocmtrain.api.crd crds

# kustomize reads no file outside manifests/, so the base carries a copy of crds/ (a test keeps them equal);
# the Helm chart manifests/helm/rocm-train-operator is generated from the base (tests/operator/test_helm.py).
manifests: crds
	mkdir -p manifests/crd
	cp crds/*.yaml manifests/crd/
	$(PY) -m rocmtrain.chart

# The generated parts of docs/ (the field reference, the pure-module list); tests/unit/test_docs.py checks them.
docs: install
	$(PY) -m rocmtrain.cli.docs

render: install
	$(BIN)/rocmtrain render $(or $(RENDER_JOB),examples/cluster-mi300x.yaml)

validate: install
	$(BIN)/rocmtrain validate --context local examples/quickstart.yaml
	$(BIN)/rocmtrain validate examples/cluster-mi300x.yaml
	$(BIN)/rocmtrain validate examples/kueue.yaml

cluster-binaries:
	tests/testworld/rocmtrain_testworld/build.sh

# The whole test world, detached (kube-scheduler, kwok GPU nodes, KubeRay, Kueue, and where this
# machine allows, the process runtime and the operator); prints its kubeconfig.
cluster-up: install cluster-binaries
	$(PY) -m rocmtrain_testworld.kubecluster up

# Stops every process of the world (the operator too, also the one run-operator runs in the foreground,
# and the pods' processes and network) and removes its state.
cluster-down:
	$(PY) -m rocmtrain_testworld.kubecluster down

# The quick start as a cluster job on the local world (brought up if needed), followed to its end.
demo: install cluster-binaries
	$(PY) -m rocmtrain_testworld.demo

# The operator in the foreground against the current KUBECONFIG (all namespaces unless
# ROCMTRAIN_NAMESPACES is set). On the world cluster-up started (KUBECONFIG unset or naming it) it
# takes over from the operator running there, so that only one acts on the jobs; cluster-down stops it.
run-operator: install
	$(PY) -m rocmtrain_testworld.kubecluster operator

# Side-by-side benchmarks; figures in docs/benchmarks.md.
bench: bench-train bench-lm bench-operator bench-world bench-checkpoint bench-flood

bench-train: install
	$(PY) bench/train_throughput.py --out runs/bench-train.json

bench-lm: install
	$(PY) bench/lm_throughput.py --runs 5 --repeat 2 --out runs/bench-lm.json

bench-operator: install cluster-binaries
	$(PY) bench/operator_bench.py --out runs/bench-operator.json

# The operator beside the real KubeRay, kube-scheduler and kwok (the test world): 500 jobs.
bench-world: install cluster-binaries
	$(PY) bench/operator_bench.py --world --out runs/bench-world.json

# What a checkpoint costs the loop on the test world's S3 server (SeaweedFS, built by cluster-binaries).
bench-checkpoint: install cluster-binaries
	$(PY) bench/checkpoint_cost.py --checkpoints 5 --steps 4 --out runs/bench-checkpoint.json

# Reconciles and status before, during and after a flood of junk tokens on the progress endpoint.
bench-flood: install cluster-binaries
	$(PY) bench/flood_bench.py --out runs/bench-flood.json

clean:
	rm -rf $(VENV) .cluster runs .pytest_cache .ruff_cache .mypy_cache
