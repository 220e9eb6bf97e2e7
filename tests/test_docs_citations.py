"""Every section the code and the READMEs cite in docs/ exists, and nothing refers to a document
outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

DOCS = ROOT / "docs"
CITED_IN = ["ckpt_migrate", "migrations", "scripts", "tests", "benchmarks", "fixtures", "docs"]
# "FORMAT.md §4.3", "MODELZOO_HISTORY.md §0, §3.5", "FORMAT_EXAMPLES.md A.1", "FORMAT.md §3."
CITATION = re.compile(
    r"\b(FORMAT|FORMAT_EXAMPLES|MODELZOO_HISTORY)(?:\.md)?\s+((?:§\s?)?[0-9A-C](?:\.\d+)*"
    r"(?:,\s*§\s?\d+(?:\.\d+)*)*)"
)
HEADING = re.compile(r"^#{2,4}\s+([0-9A-C](?:\.\d+)*)\.?\s", re.M)


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in CITED_IN:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    return files


def _sections(doc: str) -> set[str]:
    return set(HEADING.findall((DOCS / f"{doc}.md").read_text(encoding="utf-8")))


def test_every_cited_section_exists():
    sections = {doc: _sections(doc) for doc in ("FORMAT", "FORMAT_EXAMPLES", "MODELZOO_HISTORY")}
    missing, count = [], 0
    for path in _sources():
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in CITATION.finditer(line):
                for ref in re.findall(r"[0-9A-C](?:\.\d+)*", m.group(2)):
                    count += 1
                    if ref.rstrip(".") not in sections[m.group(1)]:
                        missing.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(1)} {ref}")
    assert count > 100  # the pattern still finds the citations
    assert not missing, "\n".join(missing)


def test_the_code_needs_nothing_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/reference|shared/design")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("ckpt_migrate", "migrations", "scripts", "docs", "benchmarks")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found += ["README.md"] if outside.search(readme) else []
    assert not found, found
