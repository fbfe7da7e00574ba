"""Open an HTML report (``run --html`` / ``fuzz --html``) in a real headless Chromium, check
that it loads nothing from outside the file and that every figure decodes, and save a
full-page screenshot.  Needs playwright (pip) and a Chromium: ``playwright install chromium``,
or a system one given with ``--browser`` (Debian: apt-get install chromium-headless-shell).

    python ci/report_screenshot.py report.html docs/report-screenshot.png \
        [--browser /usr/bin/chromium-headless-shell]

Exit 1 if the page requested anything but itself or a figure did not render.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page")
    p.add_argument("screenshot")
    p.add_argument("--browser", help="a Chromium executable (default: playwright's own)")
    p.add_argument("--width", type=int, default=1280)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright
    url = Path(args.page).resolve().as_uri()
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.browser, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url)
        page.wait_for_load_state("networkidle")
        images = page.evaluate("Array.from(document.images).map(i => "
                               "[i.complete && i.naturalWidth > 0, i.alt])")
        page.screenshot(path=args.screenshot, full_page=True)
        version = browser.version
        browser.close()
    outside = [u for u in requests if u != url and not u.startswith("data:")]
    broken = [alt for ok, alt in images if not ok]
    print(f"Chromium {version}: {len(images)} figure(s), {len(broken)} not rendered "
          f"{broken}; requests outside the page: {outside or 'none'}; "
          f"screenshot {args.screenshot}")
    return 1 if outside or broken else 0


if __name__ == "__main__":
    sys.exit(main())
