"""Drive a real browser (Debian's Chromium, headless, through Playwright) over the pages of
`ragline serve --index`: type a query into the search page and submit it, read the results;
open the status page and read its counts. Screenshots of both (desktop and phone widths) go to
OUT. With --facets, also read each hit's summary, labels and entities and the facet column,
then follow the first entity facet and read the narrowed results. Prints one JSON object: what
the pages showed. The test decides what is right.

    python scripts/browser-check.py URL QUERY OUT [--chromium PATH] [--facets]
"""

import argparse
import json
import sys

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright


def annotated_hits(page):
    hits = page.locator("li.hit")
    out = []
    for i in range(hits.count()):
        h = hits.nth(i)
        out.append(
            {
                "document": h.get_attribute("data-document"),
                "summary": h.locator(".summary").all_inner_texts(),
                "labels": [x.get_attribute("data-label") for x in h.locator(".label").all()],
                "entities": [x.inner_text() for x in h.locator(".entity").all()],
            }
        )
    return out


def facets(page, out):
    """The hits' annotations and the facet column; then the first entity facet followed."""
    seen = {"hits": annotated_hits(page)}
    seen["links"] = {
        section.get_attribute("data-facet"): [
            {"filter": a.get_attribute("data-filter"), "text": a.inner_text()}
            for a in section.locator("a").all()
        ]
        for section in page.locator("#facets section").all()
    }
    link = page.locator("#facets section[data-facet=entities] a").first
    if link.count():
        with page.expect_navigation():
            link.click()
        seen["narrowed_url"] = page.url
        seen["narrowed"] = annotated_hits(page)
        seen["active_filters"] = [
            x.get_attribute("data-filter") for x in page.locator("#filters .filter").all()
        ]
        page.screenshot(path=f"{out}/search-facet.png", full_page=True)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("query")
    ap.add_argument("out")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--facets", action="store_true")
    a = ap.parse_args()
    seen = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=a.chromium,
            headless=True,
            # As root in a container Chromium's sandbox cannot start.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto(a.url + "/")
        # Typed into the box the page focuses, key by key, and submitted with Enter. The
        # browser applies autofocus after the load, later on a busy machine: wait for it (10
        # s at most; a page that focuses nothing is then seen to), or the first keys are lost.
        try:
            page.wait_for_function("document.activeElement && document.activeElement.id", timeout=10000)
        except PlaywrightTimeout:
            pass
        focused = page.evaluate("document.activeElement && document.activeElement.id")
        seen["focused_on_load"] = focused
        page.keyboard.type(a.query)
        with page.expect_navigation():
            page.keyboard.press("Enter")
        seen["search_url"] = page.url
        hits = page.locator("li.hit")
        seen["hits"] = [
            {
                "document": hits.nth(i).get_attribute("data-document"),
                "marked": hits.nth(i).locator("mark").count(),
            }
            for i in range(hits.count())
        ]
        seen["query_in_box"] = page.input_value("#q")
        page.screenshot(path=f"{a.out}/search.png", full_page=True)
        if a.facets:
            seen["facets"] = facets(page, a.out)
        # The same page on a phone's width: no horizontal scrolling.
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.goto(seen["search_url"])
        seen["phone_overflow"] = phone.evaluate(
            "document.documentElement.scrollWidth > document.documentElement.clientWidth"
        )
        phone.screenshot(path=f"{a.out}/search-phone.png")
        page.goto(a.url + "/status")
        seen["status"] = {
            "documents": page.inner_text("#documents"),
            "chunks": page.inner_text("#chunks"),
            "stages": {
                row.get_attribute("data-stage"): [
                    c.strip() for c in row.locator("td").all_inner_texts()
                ]
                for row in page.locator("#stages tr[data-stage]").all()
            },
        }
        page.screenshot(path=f"{a.out}/status.png", full_page=True)
        browser.close()
    json.dump(seen, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
