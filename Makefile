# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= out/demo
SAMPLE  := sample/gr00t_robot_sim_picknplace

.PHONY: setup demo lint docs test clean lerobot-peer

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
	$(BIN)/python tools/dev/typecheck.py

# LeRobot 0.4.4 in its own venv, for the tests that run LeRobot's code beside epishard
# (tests/test_lerobot_dropin.py, tests/test_lerobot_trainer.py): built from ../shared/peers when that
# folder exists and the venv is missing (about 75 s), plus the policies' imports (about 30 s, once).
# Without ../shared/peers, or when the build fails (no PyPI), those tests skip, saying why.
PEERS        ?= ../shared/peers
LEROBOT_VENV ?= /tmp/peer/lerobot-venv
lerobot-peer:
	@if [ ! -d $(PEERS) ]; then echo "no $(PEERS): the LeRobot tests will skip"; \
	elif { test -x $(LEROBOT_VENV)/bin/python || bash $(PEERS)/setup_lerobot_venv.sh $(LEROBOT_VENV); } \
	  && bash tools/bench/peers/setup_lerobot_train.sh $(LEROBOT_VENV); then :; \
	else echo "WARNING: the LeRobot peer venv $(LEROBOT_VENV) could not be built: the LeRobot tests will skip"; fi

# The docs site (mkdocs.yml): strict, so a broken link, an unlisted page or an API reference that does
# not resolve fails it; the output goes to build/site (not committed).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site  # not --quiet: it hides the warnings strict counts

test: lint docs lerobot-peer
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache build dist
