# One command each: `make demo`, `make test`, `make bench`. Each creates what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit tools bench install clean

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

# Strict editable mode links each file, so the component folders map into one package;
# rerun on every make so that new modules are linked too.
install: $(STAMP)
	$(PY) -m pip install --quiet --no-build-isolation --no-deps \
		--config-settings editable_mode=strict -e .

# System tools the suite drives for real (TESTING.md): Prometheus/promtool, cpulimit.
tools:
	@command -v promtool >/dev/null && command -v cpulimit >/dev/null || { \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus cpulimit >/dev/null; }

demo: install
	$(PY) examples/demo.py

lint: install
	$(VENV)/bin/ruff check .

unit: install tools
	$(VENV)/bin/pytest

test: lint unit

bench: install tools
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info
