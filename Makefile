# The two commands a newcomer runs are `make demo` and `make test` (see README).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv lab-deps test test-fast demo bench bench-controller bench-controller-sweep clean docs

$(VENV)/.installed: pyproject.toml scripts/venv.sh scripts/vendor-ui.sh
	bash scripts/venv.sh

venv: $(VENV)/.installed

# As root: the lab's apt packages and a running Open vSwitch, installed before the venv
# is used so that Mininet (from Debian) is linked into it.
lab-deps:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/lab-deps.sh; fi

test: lab-deps $(VENV)/.installed
	@bash scripts/venv-mininet.sh
	$(PY) -m pytest --durations=20 $(PYTEST_ARGS)

# Everything but the lab tests (OVS, network namespaces): no root needed, a few minutes.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not lab" --durations=20 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# A real model distribution on an Open vSwitch lab (root): installs and starts OVS first.
demo: $(VENV)/.installed
	@if [ "$$(id -u)" != 0 ]; then echo "make demo: must run as root (it creates OVS bridges and network namespaces): sudo make demo" >&2; exit 1; fi
	bash scripts/lab-deps.sh
	$(PY) -m lab.demo $(DEMO_ARGS)

# Controller benchmark (prints JSON): tree computation and reroutes on fat-tree k=16.
bench-controller: $(VENV)/.installed
	@$(PY) -m bench.controller --json

# The same beyond fat-tree:16: every topology family at a few sizes, a table of ratios.
bench-controller-sweep: $(VENV)/.installed
	$(PY) -m bench.controller_sweep

# Side-by-side distribution benchmark on the OVS lab (root, ~30 min): TCP fan-out, UFTP,
# modelcast, BitTorrent and a pipelined chain, N = 1..16, with total fabric traffic; the
# host agent at 1 Gbit/s and with one lossy receiver (kernel-bridge lab); then the
# in-memory NACK-implosion scaling run; a 40-file directory vs the same bytes as one file
# (kernel-bridge lab); the agent's fixed costs part by part (kernel-bridge lab); the chaos
# run (serve and a fleet for 10 min under rotating faults, bench/chaos.py). Writes docs/bench/.
bench: $(VENV)/.installed
	@if [ "$$(id -u)" != 0 ]; then echo "make bench: must run as root (it builds an OVS lab): sudo make bench" >&2; exit 1; fi
	bash scripts/lab-deps.sh
	$(PY) -m bench.distribution $(BENCH_ARGS)
	$(PY) -m bench.agent $(BENCH_AGENT_ARGS)
	$(PY) -m bench.scale --json > docs/bench/scale.jsonl
	$(PY) -m bench.dirs > docs/bench/dirs.json
	$(PY) -m bench.fixedcost > docs/bench/fixedcost.json
	$(PY) -m bench.chaos --out docs/bench

# The documentation site (MkDocs, Material theme) from docs/ into site/; --strict fails on
# a broken link or a page missing from the nav.
docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict -d site
