"""``shardwriter.sources.REGISTRY``, the one list of source formats, and the places that must agree with it:
``FORMATS``/``ALIASES``, the table of docs/sources/README.md, ``epishard convert --help``, the openers."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest

from epishard.shardwriter.errors import SourceError
from epishard.shardwriter.sources import ALIASES, FORMATS, REGISTRY, SourceOptions, open_source
from epishard.shardwriter.sources.base import EXTRAS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs", "sources")
IDS = [f.name for f in REGISTRY]


def _table() -> dict[str, tuple[list[str], str]]:
    """docs/sources/README.md's format table: name -> (aliases, the page cell)."""
    with open(os.path.join(DOCS, "README.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `")]
    out = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        out[names[0]] = (names[1:], cells[-1])
    return out


@pytest.fixture(scope="module")
def convert_help() -> str:
    env = {**os.environ, "PYTHONPATH": REPO, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "epishard", "convert", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # the help's lines joined: a name split by wrapping still reads whole


def test_formats_and_aliases_derive_from_the_registry():
    assert FORMATS == ("lerobot", "aloha", "robomimic", "umi", "rlds", "mcap")
    assert ALIASES == {
        "libero": "robomimic",
        "act": "aloha",
        "zarr": "umi",
        "replay_buffer": "umi",
        "diffusion_policy": "umi",
        "oxe": "rlds",
        "tfrecord": "rlds",
        "ros2": "mcap",
        "rosbag": "mcap",
    }


def test_aliases_are_unique_and_never_a_name():
    aliases = [a for f in REGISTRY for a in f.aliases]
    assert len(aliases) == len(set(aliases)), aliases
    assert len(FORMATS) == len(set(FORMATS)), FORMATS
    assert not set(aliases) & set(FORMATS)


def test_the_docs_table_lists_every_format_with_its_aliases_and_page():
    table = _table()
    assert list(table) == list(FORMATS)
    for f in REGISTRY:
        aliases, page = table[f.name]
        assert sorted(aliases) == sorted(f.aliases), f.name
        assert f"]({f.docs})" in page, (f.name, page)


@pytest.mark.parametrize("name", IDS)
def test_each_docs_page_exists(name):
    entry = next(f for f in REGISTRY if f.name == name)
    assert os.path.isfile(os.path.join(DOCS, entry.docs)), entry.docs


def test_convert_help_names_every_format_and_alias(convert_help):
    for f in REGISTRY:
        assert re.search(rf"\b{f.name}\b", convert_help), f.name
        for alias in f.aliases:
            assert re.search(rf"\b{alias}\b", convert_help), alias
    listed = ", ".join(f"{f.name} ({', '.join(f.aliases)})" if f.aliases else f.name for f in REGISTRY)
    assert listed in convert_help


def test_the_clis_format_list_is_the_registrys():
    from epishard.cli.convert import FORMATS_HELP

    listed = ", ".join(f"{f.name} ({', '.join(f.aliases)})" if f.aliases else f.name for f in REGISTRY)
    # The CLI imports no writer code, so it holds the list as text: paste this line into FORMATS_HELP.
    assert listed == FORMATS_HELP, f"epishard/cli/convert.py: FORMATS_HELP = {listed!r}"


@pytest.mark.parametrize("name", IDS)
def test_each_opener_resolves_to_a_callable(name):
    entry = next(f for f in REGISTRY if f.name == name)
    module, _, function = entry.opener.partition(":")
    try:
        imported = importlib.import_module(f"epishard.shardwriter.{module}")
    except ImportError:
        for library, extra in EXTRAS.items():  # the optional library missing: skip; anything else: fail
            if extra == entry.extra:
                pytest.importorskip(library)
        raise
    assert callable(getattr(imported, function, None)), entry.opener


@pytest.mark.parametrize("given", ["x", "hdf"])
def test_an_unknown_format_is_refused_naming_the_known_ones(tmp_path, given):
    with pytest.raises(SourceError) as exc:
        open_source(str(tmp_path), SourceOptions(format=given))
    assert str(exc.value) == f"--format {given!r}: not a known format ({', '.join(FORMATS)})"
    assert str(exc.value).startswith(f"--format {given!r}: not a known format (lerobot, aloha, ")


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_is_accepted_as_its_format(tmp_path, alias):
    """No source there: the format's own reader refuses it, not the name (the alias resolved)."""
    with pytest.raises(SourceError) as exc:
        open_source(str(tmp_path / "missing"), SourceOptions(format=alias))
    assert "not a known format" not in str(exc.value)
