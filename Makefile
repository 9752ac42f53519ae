# The two commands a newcomer runs are `make demo` and `make test` (see README).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: venv test demo bench clean

$(VENV)/.installed: pyproject.toml scripts/venv.sh
	bash scripts/venv.sh

venv: $(VENV)/.installed

test: $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ]; then bash scripts/lab-deps.sh; fi
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
