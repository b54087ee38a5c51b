"""The owner console walked in a real browser (Playwright driving Debian's Chromium, as
``tests/accounts/test_browser.py``): the home says the brain is the demo one and that it answers,
and its links lead to the timeline (an entry → the run that answered it), memory, models,
packs (one turned on, then off, with the row's buttons) and devices. Every page is written
as a PNG under ``$YIMI_SCREENSHOTS_DIR`` (default ``/tmp/yimi-screenshots/``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brain.models import Run
from brain.services import accept_utterance
from capabilities.manifest import load_packs
from capabilities.registry_models import RegisteredPack
from llm import probe
from memory.models import TimelineEntry
from tests.accounts.test_browser import believe, browser, page, shot, sign_in  # noqa: F401 - fixtures used by name

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what the test wrote

PACK = "mijia"  # shipped, off by default


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, settings: Any) -> Iterator[None]:
    settings.DATA_DIR = tmp_path
    settings.YIMI_PACK_REGISTRY_DIR = tmp_path / "registry"
    settings.YIMI_PACKS_ENABLE, settings.YIMI_PACKS_DISABLE = [], []
    probe.forget()
    yield
    probe.forget()


def answered_run(owner: Any, make_device: Any) -> tuple[Run, TimelineEntry]:
    """A run that answered: the utterance, the reply (``reply_to`` it), the run succeeded."""
    phone = make_device("phone", name="kitchen phone").device
    run = Run.objects.get(id=accept_utterance(phone, uuid.uuid4().hex, "what is on my calendar today").run_id)
    reply = TimelineEntry.objects.create(owner=owner, seq=run.inbound.seq + 1, kind="reply", text="Two meetings, the first at 10:00.",
                                         device=phone, scope=run.scope, reply_to=run.inbound)
    Run.objects.filter(id=run.id).update(result_entry=reply, state=Run.State.SUCCEEDED)
    return run, reply


def go_home_and_follow(tab: Any, live_server: Any, link: str) -> None:
    tab.goto(f"{live_server.url}/")
    tab.click(f"nav.manage a:text-is('{link}')")


def test_the_owner_walks_the_console_from_the_home(page: Any, live_server: Any, owner: Any, make_device: Any, brain: Any) -> None:  # noqa: F811
    run, reply = answered_run(owner, make_device)
    believe(owner, "prefers window seats on trains", "preference.travel")
    sign_in(page, live_server, owner)
    shot(page, "console-01-home")
    brain_section = page.inner_text("section#brain")
    assert "The demo brain: scripted answers, not a real model." in brain_section and "Answering." in brain_section

    go_home_and_follow(page, live_server, "Timeline")
    page.wait_for_url("**/admin/memory/timelineentry/")
    shot(page, "console-02-timeline")
    row = page.locator("#result_list tbody tr", has_text="Two meetings, the first at 10:00.")
    row.locator("a.run-link").click()
    page.wait_for_url(f"**/admin/brain/run/{run.id}/change/")
    shot(page, "console-03-run")
    fields = page.inner_text("fieldset")
    assert "what is on my calendar today" in fields and reply.text in fields

    go_home_and_follow(page, live_server, "Memory")
    page.wait_for_url("**/admin/memory/assertion/")
    shot(page, "console-04-memory")
    assert "prefers window seats on trains" in page.inner_text("#result_list")

    go_home_and_follow(page, live_server, "Models")
    page.wait_for_url("**/admin/llm/modelrole/")
    shot(page, "console-05-models")
    assert "yimi-demo" in page.inner_text("#content")

    go_home_and_follow(page, live_server, "Packs")
    page.wait_for_url("**/admin/capabilities/registeredpack/")
    shot(page, "console-06-packs")
    assert f"{RegisteredPack.objects.count()} registered packs" in page.inner_text("#content") and RegisteredPack.objects.count() > 1
    page.click(f"button.pack-switch[data-pack='{PACK}'][value='on']")
    page.wait_for_selector("ul.messagelist")
    shot(page, "console-07-pack-on")
    assert f"{PACK.capitalize()}: switch on; the pack is on" in page.text_content("ul.messagelist")  # the admin capitalizes messages
    assert PACK in load_packs().packs
    page.click(f"button.pack-switch[data-pack='{PACK}'][value='off']")
    page.wait_for_selector("ul.messagelist")
    shot(page, "console-08-pack-off")
    assert f"{PACK.capitalize()}: switch off; the pack is off: turned off in the pack registry" in page.text_content("ul.messagelist")
    assert PACK not in load_packs().packs and RegisteredPack.objects.get(name=PACK).enabled is False

    go_home_and_follow(page, live_server, "Devices")
    page.wait_for_url("**/admin/accounts/device/")
    shot(page, "console-09-devices")
    assert "kitchen phone" in page.inner_text("#result_list")
