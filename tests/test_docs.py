"""The docs describe bubo as it is, for its users: the README stays short, every link inside the
repository leads somewhere (anchors included), the developer notes point only inside it and
cover every folder, and no page reads like a work log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md"),
                *ROOT.glob("*/**/README-dev.md")])
PAGES = [p for p in PAGES if "build" not in p.relative_to(ROOT).parts]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)}


def test_the_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 300, f"README.md has {n} lines"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_inside_the_repository_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # another site's page
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT.resolve() not in dest.parents and dest != ROOT.resolve():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, broken


@pytest.mark.parametrize("page", [ROOT / "ARCHITECTURE.md", *sorted(ROOT.glob("*/**/README-dev.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_developer_notes_point_only_inside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    assert not re.findall(r"https?://", text)
    assert "../shared" not in text


def test_the_architecture_covers_every_folder():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    tracked = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
               and p.name not in ("build", "wheelhouse", "dist", "test-output") and not p.name.endswith(".egg-info")}
    missing = [d for d in sorted(tracked) if f"`{d}/`" not in text and f"`{d}/`," not in text]
    missing += [f"bubo/{d.name}" for d in sorted((ROOT / "bubo").iterdir())
                if d.is_dir() and (d / "__init__.py").exists() and f"`bubo/{d.name}/`" not in text]
    assert not missing, missing
    csrc = (ROOT / "csrc" / "README-dev.md").read_text(encoding="utf-8")
    missing = [d.name for d in sorted((ROOT / "csrc").iterdir()) if d.is_dir() and f"| {d.name}/" not in csrc]
    assert not missing, missing


# a work log's phrases: who measured when, what a session or an issue wanted
WORK_LOG = re.compile(r"\b(this|that|the|a later|one|the next) session\b|\bsessions\b|\bthe issue\b|"
                      r"\bgoals? (is|are|was|were) (not )?met\b|\bmeasured again\b|\btest suite takes\b",
                      re.I)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_page_reads_like_a_work_log(page):
    hits = [line.strip() for line in page.read_text(encoding="utf-8").splitlines() if WORK_LOG.search(line)]
    assert not hits, hits
