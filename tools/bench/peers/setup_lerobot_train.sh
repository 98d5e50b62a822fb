#!/usr/bin/env bash
# Add what LeRobot 0.4.4's policies (ACT, Diffusion) and its `lerobot-train` script import to the
# LeRobot peer venv that ../shared/peers/setup_lerobot_venv.sh builds (that venv holds only what the
# dataset loader imports). Idempotent: a venv that already imports them is left as it is (about 1 s);
# otherwise about 30 s (PyPI). Exact versions, within lerobot 0.4.4's own ranges; torch and
# torchcodec pinned again so pip never swaps the CPU build.
# Usage: bash tools/bench/peers/setup_lerobot_train.sh [venv=/tmp/peer/lerobot-venv]
set -euo pipefail
VENV=${1:-/tmp/peer/lerobot-venv}
PY="$VENV/bin/python"
test -x "$PY" || { echo "setup_lerobot_train.sh: no venv at $VENV (bash ../shared/peers/setup_lerobot_venv.sh first)" >&2; exit 1; }
CHECK='import lerobot.scripts.lerobot_train, lerobot.policies.act.modeling_act, lerobot.policies.diffusion.modeling_diffusion'
if "$PY" -c "$CHECK" 2>/dev/null; then
  exit 0
fi
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 torchcodec==0.13.0 \
  draccus==0.10.0 einops==0.8.2 diffusers==0.35.2 termcolor==3.3.0 imageio==2.38.2 \
  pyserial==3.5 gymnasium==1.4.0 deepdiff==8.6.2 2>&1 | grep -v "lerobot 0.4.4 requires\|dependency conflicts\|resolver does not" || true
"$PY" -c "$CHECK"
echo "LeRobot trainer dependencies ready in $VENV"
