"""What the docs point at exists: every relative link in docs/ and README.md resolves (and its
#anchor names a heading of the page), and the dead-letter headers the docs name are the ones
tuneloop writes.

Links to other sites are not followed: the tests run without a network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from handlers import dead_letters

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
DEAD_LETTER_HEADER = re.compile(r"`(tuneloop-(?:error|origin|dlq|dead)[a-z*-]*)`")
"""A dead-letter header named in the docs (their family, including the old `tuneloop-dlq-*`)."""
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The page without its code: a link inside a code block or span is an example."""
    return INLINE_CODE.sub("", FENCED.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(heading) for heading in HEADING.findall(FENCED.sub("", page.read_text()))}


def links() -> list[object]:
    found = []
    for page in PAGES:
        prose = _prose(page.read_text(encoding="utf-8"))
        targets = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            found.append(pytest.param(page, target, id=f"{page.relative_to(ROOT)}->{target}"))
    return found


LINKS = links()


def test_the_docs_have_relative_links_to_check():
    assert len(LINKS) > 20


@pytest.mark.parametrize(("page", "target"), LINKS)
def test_a_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor and resolved.suffix == ".md":
        assert anchor in anchors(resolved), (
            f"{page.relative_to(ROOT)} links to #{anchor}, not a heading of {resolved.name}"
        )


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Dead letters", "dead-letters"),
        (
            "`io.tuneloop.drift.detected.v1`: a monitor found drift",
            "iotuneloopdriftdetectedv1-a-monitor-found-drift",
        ),
        ("tuneloop and the CloudEvents SDK", "tuneloop-and-the-cloudevents-sdk"),
        ("Why did (or didn't) it fire?", "why-did-or-didnt-it-fire"),
    ],
    ids=["plain", "code-and-colon", "mixed-case", "punctuation"],
)
def test_a_heading_anchor_is_the_one_github_makes(heading, expected):
    assert slug(heading) == expected


def test_the_dead_letter_headers_the_docs_name_are_the_ones_tuneloop_writes():
    written = {
        value
        for name, value in vars(dead_letters).items()
        if name.startswith("HEADER_") and isinstance(value, str)
    }
    named = {
        header
        for page in PAGES
        for header in re.findall(DEAD_LETTER_HEADER, page.read_text(encoding="utf-8"))
    }
    assert named, "the docs name no dead-letter header at all"
    assert named <= written, f"named in the docs but never written: {sorted(named - written)}"
