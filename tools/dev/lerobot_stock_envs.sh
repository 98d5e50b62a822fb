#!/usr/bin/env bash
# epishard installed into stock LeRobot environments, as a LeRobot user would install it.
#
#   bash tools/dev/lerobot_stock_envs.sh [DIR=/tmp/lerobot-stock]
#
# Builds two environments from PyPI with LeRobot's own pins, nothing overridden (about 4 minutes
# and 9 GB with the CUDA builds of torch PyPI serves; an existing one is reused):
#   DIR/044: Python 3.11, `pip install lerobot==0.4.4`            (torch 2.10, torchcodec 0.10, PyAV 15)
#   DIR/061: Python 3.12, `pip install 'lerobot[training,diffusion]==0.6.1'` (torch 2.11, torchcodec 0.11)
# then in each: `pip install --dry-run` of this checkout's wheel must change no installed package
# (epishard's ranges fit LeRobot's pins), `pip install` it, `pip check`, the LeRobot trainer tests
# (tests/test_lerobot_trainer.py: ACT and Diffusion through LeRobot's factories, every dataset
# config field honoured or refused, the packet reader) and tools/examples/train_lerobot.py, which
# runs LeRobot's own `lerobot-train` for 5 steps of ACT on the bundled sample.
# Python 3.12 comes from pyenv (LeRobot 0.6.x requires it); set PY312 to another interpreter.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-/tmp/lerobot-stock}
PY311=${PY311:-python3.11}
PY312=${PY312:-$(command -v python3.12 || echo "$HOME/.pyenv/versions/3.12.1/bin/python")}
mkdir -p "$DIR"

build_env() {  # NAME PYTHON REQUIREMENT
    local venv=$DIR/$1/venv
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import lerobot" 2>/dev/null; then
        echo "== $1: $3 into a fresh venv ($2)"
        rm -rf "$DIR/$1" && "$2" -m venv "$venv"
        "$venv/bin/pip" install -q --progress-bar off "$3"
    fi
}
build_env 044 "$PY311" "lerobot==0.4.4"
build_env 061 "$PY312" "lerobot[training,diffusion]==0.6.1"

rm -rf "$DIR/wheel" && "$REPO/.venv/bin/python" -m build -q --wheel -o "$DIR/wheel" "$REPO" >/dev/null
WHEEL=$(ls "$DIR"/wheel/epishard-*.whl)
SHARDS=$DIR/gr00t_shards
rm -rf "$SHARDS" && "$REPO/.venv/bin/epishard" convert "$REPO/sample/gr00t_robot_sim_picknplace" "$SHARDS" -q

for v in 044 061; do
    venv=$DIR/$v/venv
    "$venv/bin/pip" uninstall -q -y epishard 2>/dev/null || true
    echo "== $v: $("$venv/bin/python" -c 'import lerobot, torch, torchcodec, av; print("lerobot", lerobot.__version__, "torch", torch.__version__, "torchcodec", torchcodec.__version__, "av", av.__version__)')"
    "$venv/bin/pip" install -q --dry-run --report "$DIR/$v/report.json" "$WHEEL"
    "$venv/bin/python" - "$DIR/$v/report.json" <<'EOF'
import json, sys
names = sorted(i["metadata"]["name"] + "==" + i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"])
print("   pip would install:", names)
assert [n.split("==")[0] for n in names] == ["epishard"], "epishard's ranges would change LeRobot's environment"
EOF
    "$venv/bin/pip" install -q "$WHEEL"
    "$venv/bin/pip" check
done

echo "== LeRobot trainer tests in both environments"
EPISHARD_LEROBOT_ENV=/dev/null EPISHARD_LEROBOT_PYTHON=$DIR/044/venv/bin/python \
    EPISHARD_LEROBOT061_ENV=/dev/null EPISHARD_LEROBOT061_PYTHON=$DIR/061/venv/bin/python \
    "$REPO/.venv/bin/pytest" -q -p no:cacheprovider "$REPO/tests/test_lerobot_trainer.py" -rs

for v in 044 061; do
    echo "== $v: tools/examples/train_lerobot.py (LeRobot's lerobot-train), 5 steps of ACT"
    rm -rf "$DIR/$v/act"
    if ! (cd "$DIR/$v" && HF_HUB_OFFLINE=1 WANDB_MODE=disabled "$DIR/$v/venv/bin/python" "$REPO/tools/examples/train_lerobot.py" \
        --dataset.repo_id=epishard --dataset.root="$SHARDS" --dataset.streaming=true --dataset.episodes='[0,2,4]' \
        --policy.type=act --policy.device=cpu --policy.push_to_hub=false --policy.pretrained_backbone_weights=null \
        --epishard.image_size=32x32 --output_dir="$DIR/$v/act" --steps=5 --batch_size=4 --num_workers=2 --log_freq=1 \
        > "$DIR/$v/train.log" 2>&1); then
        tail -n 20 "$DIR/$v/train.log"; echo "train_lerobot.py failed in $v"; exit 1
    fi
    grep -oE "step:[0-9]+ .*loss:[0-9.]+" "$DIR/$v/train.log"
done
echo "== done"
