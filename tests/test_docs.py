"""The documents: README.md within 15 KB, every relative link resolving, and words about the product only.

The docs site's strict build (``make docs``, which ``make test`` runs first) checks the links of the
pages it renders; these tests check README.md too (not a site page) and run without mkdocs. The
history check keeps the documents describing what the product does, not how the code came to be:
``HISTORY`` lists phrases that only a change log of the work would use, precise enough that the
current documents hold none, and ``test_history_check_catches_a_planted_line`` shows it can fail.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 15 * 1024  # bytes
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
HISTORY = re.compile(
    r"\bthis session\b|\b(?:first|second|third|fourth|fifth|earlier|previous|last) sessions?\b|\bpreviously\b"
    r"|\bwe (?:changed|added|removed|fixed|made|moved|renamed|rewrote)\b|\bno longer\b"
    r"|(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeing )\bused to\b"  # "the writer used to", not "is used to open"
    r"|\bwas\b[^.\n]{0,60}\bnow\b|\bnow\b[^.\n]{0,60}\binstead of\b|\bsuperseded\b|\bbefore the fix\b"
    r"|\bissue \d+\b|\bas it was\b|\bthe old (?:reader|code|plan|writer|path|shape|buffer)\b",
    re.I,
)


def documents() -> list[Path]:
    """README.md and every Markdown file under docs/, relative to the repository root, sorted."""
    return [Path("README.md"), *sorted(p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The relative link targets of Markdown ``text`` (code blocks skipped), without their ``#anchor``."""
    targets = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            continue  # a URL, an anchor on the same page, an absolute path
        targets.append(target.split("#", 1)[0])
    return targets


def history_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` that uses a ``HISTORY`` phrase."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_readme_is_at_most_15_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes, more than {README_LIMIT}: move detail into docs/"


@pytest.mark.parametrize("doc", documents(), ids=str)
def test_relative_links_resolve(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    broken = [t for t in relative_links(text) if t and not (ROOT / doc.parent / t).exists()]
    assert not broken, f"{doc}: links to missing files: {broken}"


@pytest.mark.parametrize("doc", documents(), ids=str)
def test_documents_describe_the_product_not_its_history(doc):
    found = history_lines((ROOT / doc).read_text(encoding="utf-8"))
    assert not found, f"{doc}: " + "; ".join(f"line {n}: {line.strip()!r}" for n, line in found)


def test_history_check_catches_a_planted_line():
    clean = "The reader fetches the byte ranges its plan needs next.\n"
    assert history_lines(clean) == []
    for bad in (
        "In this session the reader became faster.",
        "The cache was 256 MiB; it is now 548 MiB.",
        "We changed the default shuffle.",
        "`shuffle_windows` no longer exists.",
        "The writer used to demux every packet.",
        "Previously every episode opened a decoder.",
        "Superseded by the table above (issue 16).",
    ):
        assert history_lines(clean + bad) == [(2, bad)], bad


def test_link_check_catches_a_missing_file(tmp_path):
    assert relative_links("see [the format](docs/FORMAT.md#files) and [site](https://x.org/a.md)") == ["docs/FORMAT.md"]
    assert relative_links("```\n[not a link](nowhere.md)\n```\n![chart](bench/peers_diversity.png)") == [
        "bench/peers_diversity.png"
    ]
    assert not (ROOT / "docs" / "nowhere.md").exists()


def test_every_docs_file_is_reachable():
    """Every file under docs/ is a page of the site's nav or linked from a document (none orphaned)."""
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    linked = {
        (ROOT / doc.parent / t).resolve()
        for doc in documents()
        for t in relative_links((ROOT / doc).read_text(encoding="utf-8"))
        if t
    }
    for path in sorted((ROOT / "docs").rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(ROOT / "docs").as_posix()
        assert rel in nav or path.resolve() in linked, f"docs/{rel} is neither in mkdocs.yml's nav nor linked"


def _api_pages():
    spec = importlib.util.spec_from_file_location("api_pages", ROOT / "tools" / "dev" / "api_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_lists_every_public_module_and_curated_name():
    """docs/api/ is what tools/dev/api_pages.py writes: a new module or curated name needs a rerun of it."""
    import epishard

    pages = _api_pages()
    homes = pages.curated_homes()
    for page, (package, folder, intro) in pages.PACKAGES.items():
        text = (ROOT / "docs" / "api" / page).read_text(encoding="utf-8")
        assert text == pages.package_page(package, folder, intro, homes), (
            f"docs/api/{page} is not {package}'s public modules {pages.public_modules(folder)}: "
            "run .venv/bin/python tools/dev/api_pages.py"
        )
    curated = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    missing = [name for name in epishard._API if not re.search(rf"^::: [\w.]+\.{name}$", curated, re.M)]
    assert not missing, f"docs/api/index.md lacks {missing}: run .venv/bin/python tools/dev/api_pages.py"


def test_deprecated_aliases_are_left_out_of_the_api_reference():
    pages = _api_pages()
    modules = pages.public_modules("shardwriter")
    assert "convert" in modules and "sources" in modules
    aliases = [p.stem for p in (ROOT / "shardwriter").glob("*.py") if pages.is_alias(str(p))]
    assert not set(aliases) & set(modules)


def test_make_test_builds_the_site_strictly():
    """``make test`` depends on ``make docs``, which builds with --strict and without --quiet (which would
    silence the warnings --strict counts, so a broken link would pass)."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\bdocs\b", makefile, re.M), "make test does not depend on docs"
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "no docs target in the Makefile"
    command = recipe.group(1).split("#")[0]
    assert "mkdocs build" in command and "--strict" in command and "--quiet" not in command and " -q" not in command
