"""The owner console in a real browser: Playwright for Python driving Debian's Chromium
(``executable_path``, never a downloaded browser) against pytest-django's live server on
the test database. The owner signs in through the real login form (django-axes in the
path), sees the home page, edits a memory assertion, forgets one through the preview,
revokes a device and reads a run's receipts. Every page visited is written as a PNG under
``$YIMI_SCREENSHOTS_DIR`` (default ``/tmp/yimi-screenshots/``) for review.

Without Chromium or Playwright the tests skip, except with ``YIMI_REQUIRE_SERVICES=1`` (CI),
where they fail. The tests are plain sync functions: Playwright's sync API cannot run
inside an asyncio loop."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connections

from accounts.devices import authenticate_challenge, revoke_device
from accounts.signatures import auth_message
from brain.models import Run
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.packkit import receipt, value
from capabilities.services import CallRequest, decide, record_receipt
from consent.models import ConsentCard
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.models import Assertion, AssertionVersion
from tests.conftest import need
from tests.support.gateway_support import manifest, write_pack

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what the test wrote

CHROMIUM = Path("/usr/bin/chromium")
# Outside the checkout: YIMI_SCREENSHOTS_DIR when set (to keep them), else a temporary directory.
SCREENSHOTS = Path(os.environ.get("YIMI_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "yimi-screenshots")
OWNER_PASSWORD = "correct horse battery"  # the conftest owner's
T = TypeVar("T")
WAIT_MS = 20_000  # generous: a busy 2-core machine; a passing test never waits this long

OUTBOX_TOOLS = '''
from capabilities.packkit import ToolRegistry, receipt

TOOLS = ToolRegistry()


@TOOLS("Send a message.", {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}})
def send(args):
    return receipt("succeeded")


@TOOLS("Read the calendar.", {"type": "object", "properties": {"day": {"type": "string"}}})
def calendar(args):
    return receipt("succeeded")
'''


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need(CHROMIUM.exists(), f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    need(importlib.util.find_spec("playwright") is not None, "playwright is not installed (requirements-dev.lock)")
    from playwright.sync_api import sync_playwright

    # Between two sync calls Playwright marks its own event loop as running in this thread
    # (playwright/sync_api/_context_manager.py), so Django would refuse the test's ORM calls
    # as "async unsafe". Nothing runs on that loop while the test's code does; the
    # permission lasts as long as the browser, and only for this module.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path


@pytest.fixture
def packs(tmp_path: Path, settings: Any) -> Iterator[Path]:
    """An outbox pack: sending asks the owner (a consent card), reading the calendar observes."""
    directory = tmp_path / "packs"
    directory.mkdir()
    tools = {"send": {"effect": "send", "target": "to", "task_type": "message", "retry": "forbidden"},
             "calendar": {"effect": "observe"}}
    write_pack(directory, "outbox", manifest("outbox", scopes=["owner"], tools=tools), tools_py=OUTBOX_TOOLS)
    settings.YIMI_PACKS_DIR = directory
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Any, live_server: Any, owner: Any) -> None:
    """The real login form: ``/`` sends a signed-out visitor there, and back after."""
    page.goto(f"{live_server.url}/")
    assert "/admin/login/" in page.url
    shot(page, "01-login")
    page.fill("#id_username", owner.get_username())
    page.fill("#id_password", OWNER_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def online(sim: Any) -> None:
    """The device answers a websocket challenge (the service the consumer calls)."""
    nonce = uuid.uuid4().hex
    authenticate_challenge(sim.device.id, nonce, sim.sign(auth_message(nonce, str(sim.device.id))))


def believe(owner: Any, text: str, predicate: str) -> str:
    return str(assertions.commit(
        CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate=predicate, payload={"text": text},
                      expected_version=0, actor="agent")
    ).assertion_id)


def in_thread(work: Callable[[], T]) -> T:
    """Run ``work`` on a thread of its own: services that push to devices after commit go
    through ``async_to_sync``, which refuses a thread whose loop is marked running."""
    def run() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=60)


def open_run_waiting_on_a_card(make_device: Any) -> tuple[Run, Any]:
    """A run still open: it read the calendar (a receipt) and asked to send Alice a note (a
    consent card, and the gateway's waiting receipt)."""
    phone = make_device("phone", name="kitchen phone")
    online(phone)
    run = Run.objects.get(id=accept_utterance(phone.device, uuid.uuid4().hex, "tell Alice I am running late").run_id)
    looked = decide(CallRequest(str(run.id), "outbox__calendar", {"day": "today"}))
    assert looked.executes
    record_receipt(looked.call_id, receipt("succeeded", summary="3 meetings today, the next at 15:00",
                                           values=[value("meetings", 3, "count", "calendar")]))
    asked = in_thread(lambda: decide(CallRequest(str(run.id), "outbox__send", {"to": "alice", "text": "running 10 minutes late"})))
    assert asked.decision == "ask" and asked.card_id
    return run, phone


def test_the_owner_signs_in_and_sees_what_yimi_is_doing(page: Any, live_server: Any, owner: Any, make_device: Any,
                                                         packs: Path) -> None:
    run, _ = open_run_waiting_on_a_card(make_device)
    make_device("mac", name="study mac")  # paired, never connected
    sign_in(page, live_server, owner)
    shot(page, "02-home")
    body = page.inner_text("body")
    assert f"Signed in as {owner.get_username()}" in body
    working = page.locator("section#runs")
    assert str(run.id)[:8] in working.inner_text() and "queued" in working.inner_text()
    assert "tell Alice I am running late" in working.inner_text()
    waiting = page.locator("section#cards").inner_text()
    card = ConsentCard.objects.get(run=run)
    assert "consent (send)" in waiting and "outbox__send → alice" in waiting and card.state == "pending"
    devices = page.locator("section#devices").inner_text()
    assert re.search(r"kitchen phone\s+phone\s+online", devices), devices
    assert re.search(r"study mac\s+mac\s+never", devices), devices


def test_the_owner_edits_an_assertion_through_the_form(page: Any, live_server: Any, owner: Any) -> None:
    a = believe(owner, "drinks green tea without sugar", "preference.drink")
    sign_in(page, live_server, owner)
    page.goto(f"{live_server.url}/admin/memory/assertion/")
    shot(page, "03-assertions")
    assert "drinks green tea without sugar" in page.inner_text("#result_list")
    page.click(f"a[href$='/admin/memory/assertion/{a}/change/']")
    assert page.input_value("#id_text") == "drinks green tea without sugar"
    shot(page, "04-assertion-edit")
    page.fill("#id_text", "drinks green tea, a little honey is fine")
    page.click("input[type=submit][value='Save as a new version']")
    page.wait_for_selector("ul.messagelist")
    shot(page, "05-assertion-saved")
    assert "Saved as version 2." in page.inner_text("ul.messagelist")
    assert page.input_value("#id_text") == "drinks green tea, a little honey is fine"
    history = page.locator("table.assertion-history tbody tr")
    assert history.count() == 2
    assert "v2" in history.nth(0).inner_text() and "a little honey is fine" in history.nth(0).inner_text()
    assert "v1" in history.nth(1).inner_text() and "without sugar" in history.nth(1).inner_text()
    assert "owner" in history.nth(0).inner_text() and "agent" in history.nth(1).inner_text()
    assert AssertionVersion.objects.get(assertion_id=a, version=2).payload == {"text": "drinks green tea, a little honey is fine"}


def test_the_owner_forgets_an_assertion_through_the_preview(page: Any, live_server: Any, owner: Any) -> None:
    kept = believe(owner, "likes long walks by the river", "preference.leisure")
    gone = believe(owner, "collects vintage stamps", "preference.hobby")
    sign_in(page, live_server, owner)
    page.goto(f"{live_server.url}/admin/memory/assertion/{gone}/change/")
    page.click("a.deletelink")
    page.wait_for_url(f"**/admin/memory/assertion/{gone}/forget/")
    shot(page, "06-forget-preview")
    preview = page.inner_text("#content-main")
    assert "collects vintage stamps" in preview and "preference.hobby" in preview and "Not erased:" in preview
    assert Assertion.objects.get(id=gone).state == "active"  # the preview changes nothing
    page.click("input[type=submit][value='Yes, forget it']")
    page.wait_for_url(f"{live_server.url}/admin/memory/assertion/")
    shot(page, "07-forgotten")
    assert "Forgot 1 assertion; the payloads of 1 version were erased." in page.inner_text("ul.messagelist")
    listing = page.inner_text("#result_list")
    assert "collects vintage stamps" not in listing and "(forgotten)" in listing and "likes long walks by the river" in listing
    assert Assertion.objects.get(id=gone).state == "forgotten" and Assertion.objects.get(id=kept).state == "active"


def test_the_owner_revokes_a_device_and_filters_the_revoked(page: Any, live_server: Any, owner: Any, make_device: Any) -> None:
    make_device("phone", name="kitchen phone")
    glasses = make_device("glasses", name="old glasses").device
    sign_in(page, live_server, owner)
    page.goto(f"{live_server.url}/admin/accounts/device/")
    shot(page, "08-devices")
    row = page.locator("#result_list tbody tr", has_text="old glasses")
    assert "no" in row.locator("td.field-revoked").inner_text()
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "revoke")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    shot(page, "09-device-revoked")
    assert "Revoked 1 device(s)." in page.inner_text("ul.messagelist")
    revoked_cell = page.locator("#result_list tbody tr", has_text="old glasses").locator("td.field-revoked").inner_text()
    assert revoked_cell.startswith("revoked 20"), revoked_cell
    page.click("#changelist-filter a:text-is('Revoked')")
    page.wait_for_url("**/admin/accounts/device/?revoked=yes")
    shot(page, "10-devices-revoked-filter")
    listing = page.inner_text("#result_list")
    assert "old glasses" in listing and "kitchen phone" not in listing
    page.click("#changelist-filter a:text-is('In use')")
    page.wait_for_url("**/admin/accounts/device/?revoked=no")
    listing = page.inner_text("#result_list")
    assert "kitchen phone" in listing and "old glasses" not in listing
    glasses.refresh_from_db()
    assert glasses.revoked_at is not None
    assert revoke_device(glasses) is False  # already revoked by the page


def test_the_owner_reads_a_runs_receipts(page: Any, live_server: Any, owner: Any, make_device: Any, packs: Path) -> None:
    run, _ = open_run_waiting_on_a_card(make_device)
    sign_in(page, live_server, owner)
    page.click(f"section#runs a[href$='/admin/brain/run/{run.id}/change/']")
    page.wait_for_url(f"**/admin/brain/run/{run.id}/change/")
    shot(page, "11-run")
    fields = page.inner_text("fieldset")
    assert re.search(r"The sentence that started it:\s+tell Alice I am running late", fields), fields
    assert re.search(r"Scope:\s+owner", fields) and re.search(r"State:\s+Queued", fields), fields
    calls = page.locator("tr.has_original", has_text="outbox__")
    assert calls.count() == 2
    looked, asked = calls.nth(0).inner_text(), calls.nth(1).inner_text()
    assert "outbox__calendar" in looked and "Allow" in looked
    assert "r1 succeeded: 3 meetings today, the next at 15:00" in looked
    assert "outbox__send" in asked and "waiting_for_owner" in asked
    assert "r1 waiting: waiting for your confirmation" in asked
