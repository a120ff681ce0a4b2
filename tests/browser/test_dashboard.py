"""The dashboard in a real browser: Debian's headless Chromium, driven by playwright.

A user logs in with the server's key, leaves the page open, talks to the model and sees a
version published; the page shows the new version and the counts without a reload. Then the
session's page shows a hostile prompt as text. A screenshot of each page lands in tmp_path.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from playwright.sync_api import expect

from clawrl.testing import Publisher
from tests.conftest import ROOT, RemoteServer
from tests.service.scripted_judge import HINT, ScriptedJudge
from tests.service.test_judge import two_turns
from tests.timing import limit

CHROMIUM = Path("/usr/bin/chromium")
# This machine's closed network refuses Chromium's background connections: keep them all off.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEY = "browser-key-0123456789"
XSS = '<img src=x onerror="window.__xss = 1"><script>window.__xss = 2</script>'


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():  # `scripts/test` installs it; a bare `pytest` gets one more try
        subprocess.run([ROOT / "scripts" / "setup-chromium"], timeout=limit(600), check=False)
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: scripts/setup-chromium could not install Debian's chromium here")
    from playwright.sync_api import sync_playwright  # only with a browser to drive

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    judge = ScriptedJudge()
    args = ["--model", str(tiny_model_dir), "--judge.backend", "openai", "--judge.base-url", judge.url]
    args += ["--judge.model", "scripted", "--train.swap-poll-s", "0.2"]
    s = RemoteServer(tmp_path_factory.mktemp("browser") / "run", args, env={"CLAWRL_API_KEY": KEY})
    yield s
    s.stop()
    judge.stop()


def card(page, name: str) -> str:
    return page.text_content(f'[data-count="{name}"] .value')


def test_the_open_dashboard_follows_a_conversation_and_a_new_version(
    browser, server, tmp_path, tiny_model_dir
):
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    page.set_default_timeout(limit(30) * 1000)
    page.goto(server.url + "/dashboard")
    page.fill('input[name="key"]', KEY)  # the login form: the key is typed, never put in a URL
    page.click('button[type="submit"]')
    page.wait_for_selector("#live.ok")
    assert page.text_content("#served-version") == "v0" and card(page, "main") == "0"
    page.evaluate("window.__same_page = true")  # gone if anything reloads the page

    client = server.client(api_key=KEY)
    two_turns(client, f"Write a poem about the sea. {XSS}", "No, that's wrong, redo it.", 6)
    Publisher(server.run_dir, tiny_model_dir).publish(1)

    # Locator assertions poll without evaluating strings, which the page's CSP (rightly) refuses.
    expect(page.locator("#served-version")).to_have_text("v1", timeout=limit(30) * 1000)
    expect(page.locator('[data-count="judged"] .value')).to_have_text("1", timeout=limit(60) * 1000)
    assert page.evaluate("window.__same_page") is True
    assert (card(page, "turns"), card(page, "main"), card(page, "next_state")) == ("2", "2", "1")
    assert card(page, "ready") == "2"  # the redo turn's combine sample (opd, r = -1) and its hint rewrite
    assert page.is_visible('#versions tr[data-version="v1"]')
    assert page.locator("#reward-version svg rect").count() == 1  # v0's turns, mean score -1
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

    page.click("#sessions a")
    page.wait_for_selector(".turn .judgment")
    text = page.text_content("#turns")
    assert XSS in text and HINT in text  # the prompt shown as text, not run as markup
    assert page.evaluate("window.__xss") is None
    assert page.locator("#turns img, #turns script").count() == 0
    page.screenshot(path=str(tmp_path / "session.png"), full_page=True)
    page.close()


def test_without_the_key_the_page_is_only_a_login_form(browser, server):
    page = browser.new_page()
    page.set_default_timeout(limit(30) * 1000)
    response = page.goto(server.url + "/dashboard")
    assert response.status == 401 and page.is_visible('input[name="key"]')
    page.fill('input[name="key"]', "not-the-key")
    page.click('button[type="submit"]')
    page.wait_for_selector(".error")
    assert "not this server's API key" in page.text_content(".error")
    assert page.locator("#served-version").count() == 0
    page.close()
