# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint check test test-full test-matrix test-unit fuzz demo cni-plugins bench bench-quick soak apiserver-faults fleet dashboard-picture deploy image image-cni-plugins clean

install: $(STAMP)

$(STAMP): pyproject.toml $(shell find cnidra/_proto -name '*.proto')
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	PYTHON=$(BIN)/python hack/gen-protos.sh >/dev/null
	touch $@

cni-plugins:
	hack/install-cni.sh

lint: install
	$(BIN)/ruff check cnidra tests bench hack testbed
	$(BIN)/mypy

# pytest-xdist workers for the unit half; 3 on this project's 2-core machine was the fastest
# (its tests wait on subprocesses and sockets as much as they compute): 2 and 4 were slower.
# worksteal: an idle worker takes queued tests from a busy one (the builds and fuzzers).
JOBS ?= 3
PARALLEL := -n $(JOBS) --dist worksteal

# the edit-test loop, minutes: ruff, mypy and every test that needs neither root nor the test
# bed (markers netns and testbed: pyproject.toml), in parallel. Its time is in the README.
check: install
	$(BIN)/ruff check cnidra tests bench hack testbed
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) -m "not netns and not testbed"

# lint, then the two halves at once (hack/run-tests.py): the unit half in parallel (the netns
# tests too: each in namespaces and state roots of its own), below normal CPU priority, beside
# the test bed's half in one process (one cluster session shared by its modules); a unit
# failure stops the test bed's half (SIGINT: its fixtures still clean up)
HALVES := $(BIN)/python hack/run-tests.py $(BIN)/pytest --unit -q $(PARALLEL) -m "not testbed"
test: install lint cni-plugins
	$(HALVES) --testbed -q -m "testbed and not full" --durations=15

# make test, with every e2e test that uses the `deployment` fixture run a second time against
# the in-cluster driver (the chart's DaemonSet of `make image`'s image) and the `full` tests (a
# second image build, to prove it reproducible; the chart with each ci/ values file): what CI
# runs nightly
test-full: install lint cni-plugins
	CNIDRA_TEST_FULL=1 $(HALVES) --testbed -q -m testbed

# the unit half alone, as make test runs it (root needed, no test bed)
test-unit: install cni-plugins
	$(BIN)/pytest -q $(PARALLEL) -m "not testbed"

# the test bed's e2e suite on each Kubernetes release of MATRIX (make test runs the newest,
# 1.37.2); each release's components are built once into the cache. Its time is in the README.
MATRIX ?= v1.36.3 v1.37.2
test-matrix: install cni-plugins
	@set -e; for v in $(MATRIX); do \
		case $$v in \
			v1.36.*) etcd=v3.6.8; crictl=v1.36.0;; \
			*) etcd=v3.7.3; crictl=v1.37.0;; \
		esac; \
		echo "== Kubernetes $$v (etcd $$etcd, crictl $$crictl)"; \
		K8S_VERSION=$$v ETCD_VERSION=$$etcd CRITOOLS_VERSION=$$crictl testbed/build.sh; \
		K8S_VERSION=$$v ETCD_VERSION=$$etcd CRITOOLS_VERSION=$$crictl \
			$(BIN)/pytest -q -p no:cacheprovider tests/testbed; \
	done

# the tenant-config fuzzers at length: the differential test against the plugins' own Go
# decoders (tests/cni/test_decoders.py) and the parsers' fuzzers; `make test` runs them bounded
fuzz: install
	CNIDRA_FUZZ_EXAMPLES=$${CNIDRA_FUZZ_EXAMPLES:-20000} $(BIN)/pytest -q -p no:cacheprovider \
		tests/cni/test_decoders.py tests/dra/test_one_verdict.py tests/api/test_loading_fuzz.py \
		tests/api/test_tenant.py tests/cni/test_node_effects.py

demo: install cni-plugins
	hack/demo.sh

# the driver's OCI image, dist/cnidra-image.tar (no Docker: mmdebstrap + pip + testbed/oci.py)
image: install
	hack/image/build.sh
	hack/package-chart.sh

# the same with the CNI reference plugins bundled, for the chart's cniPlugins.install
image-cni-plugins: install
	CNI_PLUGINS=1 hack/image/build.sh

# deploy/ is rendered from charts/cnidra (a test fails when they differ)
deploy:
	hack/render-deploy.sh

# every benchmark, one at a time (bench/run.py: the quick ones, then the ones on the test bed,
# a singleton), into docs/performance/bench-latest.json, then the README's tables between its
# bench markers rendered from that file, with the machine and the date (bench/report.py). About
# 52 minutes on this project's 2-core machine: the quick ones 5, pod_ready 11 (five ways),
# driver_latency 4, ipam 7, node_api 1, claims_scale 5, transport 2, fleet at 1,000 nodes 15, and
# the peers' first build 4 (`python -m bench.run --list` prints the plan). A benchmark that fails or times out is a
# "not run" row and make's status 1, after the README is rendered.
bench: install cni-plugins
	@status=0; $(BIN)/python -m bench.run --command 'make bench' || status=$$?; \
		$(BIN)/python -m bench.report && exit $$status

# the quick ones only (no test bed, about 2 minutes), into build/bench-quick.json; the README
# is left alone (its tables are from a full run), the goals table printed instead
bench-quick: install cni-plugins
	@status=0; $(BIN)/python -m bench.run --quick --out build/bench-quick.json || status=$$?; \
		$(BIN)/python -m bench.report build/bench-quick.json --print && exit $$status

# pods through the real kubelet and containerd on the test bed, the driver sampled for growth
# (not in `make test`; its time per 1,000 cycles is in the README). CYCLES=200 for a short one.
CYCLES ?= 10000
soak: install cni-plugins
	$(BIN)/python -m bench.soak --cycles $(CYCLES)

# the driver behind a slow and throttling apiserver (a fault-injecting proxy on loopback)
apiserver-faults: install cni-plugins
	$(BIN)/python -m bench.apiserver_faults

# cnidra's slices and its drivers at rest on NODES fake nodes, beside dra-example-driver's
# shape, on a control plane of its own (etcd, apiserver, scheduler of the test bed's build, on
# free loopback ports; the test bed itself is not used). About 8 minutes at 1,000 nodes.
NODES ?= 1000
fleet: install
	$(BIN)/python -m bench.fleet --nodes $(NODES) --json

# docs/dashboard.png: the chart's Grafana dashboard's queries over the test bed's data
dashboard-picture: install cni-plugins
	$(BIN)/python -m bench.dashboard_picture

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis dist
