# pko-rs: a sharded, PKO v2-compatible Kubernetes operator for Pulumi stacks.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test testbed testbed-down demo demo-down crds docs build lint images

## test: bring up the test bed (building it on a cold machine), then run every test of the workspace
test: testbed
	@scripts/test.sh

REPLICAS ?= 1
RUNTIME ?= local

## demo: the main job end to end on the local test bed (operator, agents, sample stacks), building only what it
## uses (TESTBED_PROFILE=demo: control plane, Pulumi CLI, YAML host, command provider, Redis);
## REPLICAS=3: a fleet of three replicas over redis, one of them killed mid-run;
## RUNTIME=pod: on the bed's node, installed with Helm, the operator and workspaces in pods
demo:
	@if [ "$(RUNTIME)" = pod ]; then scripts/demo-pod.sh; else REPLICAS=$(REPLICAS) scripts/demo.sh; fi

## demo-down: stop what `make demo` started
demo-down:
	@. <(TESTBED_PROFILE=demo scripts/testbed/ensure.sh 2>/dev/null | grep '^export'); scripts/demo-down.sh

## testbed: install packages, build the third-party binaries (cached outside the repo), start the bed
testbed:
	@scripts/testbed/ensure.sh

## images: the images of deploy/images (pko-operator, pko-agent, pko-workspace) built without a container
## engine (mmdebstrap + umoci), as OCI archives under ~/.cache/pko/testbed/images, imported into the bed's node
images: testbed
	@scripts/images/build.sh

## testbed-down: stop exactly the processes `make testbed` started and remove its run directory
testbed-down:
	@scripts/testbed/down.sh

## crds: regenerate deploy/crds/*.yaml from the API types
crds:
	$(CARGO) run -q -p pko-operator -- crds --out deploy/crds

## docs: regenerate docs/api.md from the API types
docs:
	$(CARGO) run -q -p pko-operator -- api-docs > docs/api.md

build:
	$(CARGO) build --workspace --all-targets

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
