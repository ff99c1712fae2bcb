"""Headless Chromium for tests of the pages the gateway serves (the dashboard).

Debian's `chromium` and `chromium-driver` (installed by `scripts/bootstrap.sh --test`),
driven through WebDriver with selenium. The flags keep Chromium from reaching for the
network on its own (these machines have none: it would retry refused connections) and
from touching any profile but a fresh one:

    with headless_chromium(tmp_path) as browser:
        browser.get(url)
        browser.save_screenshot(str(tmp_path / "page.png"))

`secret_lines(state_dir)` gives what a page must never contain: the long lines of every
private key and kubeconfig credential the gateway wrote.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--window-size=1366,900",  # a laptop screen
)


class BrowserMissingError(RuntimeError):
    pass


@contextlib.contextmanager
def headless_chromium(scratch: Path | None = None) -> Iterator[Any]:
    """A selenium WebDriver on a fresh profile; quits and removes the profile afterwards."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise BrowserMissingError(f"{path} is missing: install Debian's chromium and chromium-driver "
                                      "(scripts/bootstrap.sh --test does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=scratch))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def secret_lines(state_dir: Path) -> list[str]:
    """The first 40 characters of each long line of every private key and kubeconfig credential
    under `state_dir` (PEM armour lines aside): a page that shows any of them leaks it."""
    found = []
    for path in state_dir.rglob("*"):
        if path.is_file() and (path.suffix == ".key" or path.name.endswith("kubeconfig")):
            for line in path.read_text(errors="replace").splitlines():
                line = line.strip()
                secretish = "data" in line or path.suffix == ".key"
                if len(line) >= 40 and not line.startswith("-----") and secretish:
                    found.append(line.split(":")[-1].strip()[:40])
    return found
