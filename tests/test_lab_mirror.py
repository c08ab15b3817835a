"""The lab builds from this machine's own Debian mirror (its apt sources), so the repository names
no package mirror: deb822 and one-line sources, the suite that decides, the staged file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llmfleet.errors import CheckFailed
from llmfleet.lab import images as L

ROOT = Path(__file__).resolve().parents[1]

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.internal/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.internal/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.internal/debian
Suites: bookworm
"""

ONE_LINE = """\
# deb http://commented.internal/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://vendor.internal/apt cloud-sdk-bookworm main
deb http://old.internal/debian/ bookworm main contrib
"""


def test_deb822_stanzas():
    assert L.apt_source_entries(DEB822, deb822=True) == [
        ("http://mirror.internal/debian", ["bookworm", "bookworm-updates"]),
        ("http://mirror.internal/debian-security", ["bookworm-security"]),
    ]


def test_one_line_sources_with_options():
    assert L.apt_source_entries(ONE_LINE, deb822=False) == [
        ("https://vendor.internal/apt", ["cloud-sdk-bookworm"]),
        ("http://old.internal/debian/", ["bookworm"]),
    ]


def test_the_mirror_is_the_source_of_the_base_suite(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (tmp_path / "sources.list").write_text(ONE_LINE)
    (d / "debian.sources").write_text(DEB822)
    # sources.list comes first: the vendor's "cloud-sdk-bookworm" is not the suite, the next line is
    assert L.debian_mirror("bookworm", (tmp_path / "sources.list", d)) == "http://old.internal/debian"
    assert L.debian_mirror("bookworm", (d,)) == "http://mirror.internal/debian"


def test_no_source_for_the_suite_says_what_to_add(tmp_path):
    (tmp_path / "a.list").write_text("deb http://x.internal/debian trixie main\n")
    with pytest.raises(CheckFailed, match="no apt source for Debian bookworm in .*Suites: bookworm"):
        L.debian_mirror("bookworm", (tmp_path,))


def test_the_staged_sources_file_gets_the_mirror():
    text = (ROOT / "dockerfiles/lab-host/trixie.sources").read_text()
    assert L.MIRROR_PLACEHOLDER in text
    filled = L.fill_mirror(text, "http://mirror.internal/debian")
    assert "URIs: http://mirror.internal/debian\n" in filled and L.MIRROR_PLACEHOLDER not in filled


# Pages a catalog cites as a source (package information, bug and source trackers): apt fetches nothing there.
SOURCE_PAGES = {"packages.debian.org", "wiki.debian.org", "bugs.debian.org", "tracker.debian.org",
                "salsa.debian.org", "github.com"}


def archive_urls(text: str) -> list[str]:
    """URLs naming Debian that are not a source page."""
    url = re.compile(r"https?://([^/\s\"']+)[^\s\"']*", re.I)
    return [m.group(0) for m in url.finditer(text)
            if "debian" in m.group(0).lower() and m.group(1).lower() not in SOURCE_PAGES]


def test_the_repository_names_no_debian_package_mirror():
    """No URL of a Debian archive in the code or the Dockerfiles: the mirror comes from apt's sources.
    Package information pages a catalog cites as sources are not archives."""
    tracked = subprocess.run(["git", "ls-files", "src", "dockerfiles", "scripts"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    hits = [f"{name}: {u}" for name in tracked.splitlines() if (ROOT / name).is_file()
            for u in archive_urls((ROOT / name).read_text(encoding="utf-8", errors="replace"))]
    assert hits == []


def test_an_archive_url_is_caught_and_a_package_page_is_not():
    assert archive_urls("URIs: http://deb.example.org/debian") == ["http://deb.example.org/debian"]
    assert archive_urls("source: https://packages.debian.org/bookworm/docker.io") == []
