"""The wheel installs into a fresh venv next to PyPI's ``balance`` without a name collision.

Builds the wheel from a copy of the sources (``python -m build --wheel --no-isolation``: no build
files in the checkout, no network), makes a venv with ``python -m venv``, lets it see this
interpreter's packages (torch, torchcodec, pyarrow, ...: the pinned requirements) through a ``.pth``
file, installs PyPI's ``balance`` and then the wheel, both ``--no-deps``, and runs the installed
``epishard`` command and imports in the venv with ``python -I`` (neither this checkout nor
``PYTHONPATH`` on the path).

``balance``'s own dependencies (pandas, scipy < 1.14, scikit-learn < 1.4 and, on Python < 3.12,
numpy < 2) are left out: they conflict with the pinned numpy and do not change what is checked
here, which is where each distribution's files go in site-packages. The wheel holds ``epishard/``
only, the two distributions' file lists are disjoint, and ``import balance`` finds PyPI's package.
The balance wheel is downloaded once into pytest's cache; without network (and no cached copy)
the test is skipped, saying so.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from conftest import REPO

BALANCE = "balance==0.23.0"  # PyPI's survey-weighting library: the name the old top-level balance/ took
SOURCES = ("pyproject.toml", "README.md", "epishard", "shardwriter", "stream", "balance")
CONTRACT_MODULES = sorted(p.stem for p in (REPO / "epishard" / "format").glob("*.py"))


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, **kw)
    assert p.returncode == 0, f"{cmd}: {p.stdout}\n{p.stderr}"
    return p


def _balance_wheel(cache_dir: str) -> str:
    """PyPI's balance wheel, from pytest's cache or downloaded into it (skip without network)."""
    found = glob.glob(os.path.join(cache_dir, "balance-*.whl"))
    if found:
        return found[0]
    p = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", cache_dir, BALANCE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = glob.glob(os.path.join(cache_dir, "balance-*.whl"))
    if p.returncode or not found:
        pytest.skip(f"cannot download {BALANCE} from PyPI (no network?): {p.stderr.strip()[-300:]}")
    return found[0]


def _build_wheel(tmp_path) -> str:
    pytest.importorskip("build", reason="python -m build is in the dev extra (requirements/machine.txt pins it)")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if os.path.isdir(REPO / name):
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)])
    (wheel,) = glob.glob(str(tmp_path / "dist" / "epishard-*.whl"))
    return wheel


def _venv(path) -> tuple[str, str]:
    """(python, site-packages) of a new venv that also sees this interpreter's packages."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = str(path / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    # Appended after the venv's own site-packages: what the wheel installed is found first.
    with open(os.path.join(site, "pinned-requirements.pth"), "w") as f:
        f.write("".join(p + "\n" for p in sorted(ours)))
    return python, site


def _record(site: str, dist: str) -> set[str]:
    """Paths (relative to site-packages) a distribution installed, from its RECORD."""
    (info,) = glob.glob(os.path.join(site, f"{dist}-*.dist-info"))
    with open(os.path.join(info, "RECORD")) as f:
        return {row[0] for row in csv.reader(f)}


def test_wheel_installs_beside_pypi_balance(tmp_path, request):
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    balance_wheel = _balance_wheel(str(cache.mkdir("pypi-balance") if cache else tmp_path))
    wheel = _build_wheel(tmp_path)
    python, site = _venv(tmp_path / "venv")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q"]
    _run([*pip, balance_wheel])
    _run([*pip, wheel])

    ours, theirs = _record(site, "epishard"), _record(site, "balance")
    tops = {p.split("/")[0] for p in ours if not p.startswith("..")}  # "../../../bin/epishard": the command
    assert tops == {"epishard", os.path.basename(glob.glob(os.path.join(site, "epishard-*.dist-info"))[0])}
    assert "epishard/py.typed" in ours and "balance/__init__.py" in theirs
    contract = {p for p in ours if p.startswith("epishard/format/") and p.endswith(".py")}
    assert contract == {f"epishard/format/{m}.py" for m in CONTRACT_MODULES}  # the format package, whole
    assert not ours & theirs
    for name in ("stream", "shardwriter"):
        assert not os.path.exists(os.path.join(site, name))

    probe = (
        "import importlib.util, json, epishard, epishard.stream, epishard.balance, epishard.shardwriter\n"
        "import epishard.format.opening, epishard.format.decoder\n"
        "from epishard import WindowDataset, convert\n"
        "print(json.dumps({m: importlib.util.find_spec(m) and importlib.util.find_spec(m).origin"
        " for m in ('epishard.stream', 'epishard.balance', 'epishard.shardwriter', 'epishard.format', 'balance',"
        " 'stream', 'shardwriter')} | {'version': epishard.__version__}))"
    )
    found = _run([python, "-I", "-c", probe], cwd=str(tmp_path)).stdout.strip().splitlines()[-1]
    origins = json.loads(found)
    for name in ("stream", "balance", "shardwriter", "format"):
        assert origins[f"epishard.{name}"] == os.path.join(site, "epishard", name, "__init__.py")
    assert origins["balance"] == os.path.join(site, "balance", "__init__.py")  # PyPI's, untouched
    assert origins["stream"] is None and origins["shardwriter"] is None
    version = {}
    exec((REPO / "epishard" / "_version.py").read_text(), version)
    assert origins["version"] == version["__version__"]

    cli = _run([str(tmp_path / "venv" / "bin" / "epishard"), "--help"], cwd=str(tmp_path)).stdout
    assert "convert" in cli and "verify" in cli and "stream" in cli
