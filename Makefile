# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= out/demo
SAMPLE  := sample/gr00t_robot_sim_picknplace

.PHONY: setup demo lint test clean

$(BIN)/epishard: pyproject.toml requirements/machine.txt
	@command -v ffmpeg >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq ffmpeg >/dev/null; }
	@# Headless Chromium: the test that loads `epishard preview`'s page in a real browser.
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/machine.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(BIN)/epishard

setup: $(BIN)/epishard

demo: setup
	rm -rf $(OUT) $(OUT)-preview.html $(OUT)-preview_sheets
	$(BIN)/epishard convert $(SAMPLE) $(OUT) --max-episodes-per-shard 2 --workers 2
	$(BIN)/epishard verify $(OUT)
	$(BIN)/epishard inspect $(OUT)
	$(BIN)/epishard preview $(OUT) --windows 4 --out $(OUT)-preview.html
	$(BIN)/epishard stream $(OUT) --frames 9 --span 33 --action-horizon 16 --size 224x224 --batch-size 8 --batches 30 --workers 2

# The quality gates: lint, formatting, types (the packages under their installed names).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py

test: lint
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache build dist
