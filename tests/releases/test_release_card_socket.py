"""The protected-baseline card over the real device socket: pushed to the owner's phone as
``release.card``, sent again to a phone that connects later, answered with a signed
``release.answer`` (docs/protocol.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from releases import baseline
from releases.models import Release
from tests.conftest import db_async, open_socket, receive_until

pytestmark = pytest.mark.django_db(transaction=True)


def candidate() -> Release:
    return Release.objects.create(build_id="dir:cand", kind="directory", commit="c" * 40, base_commit="b" * 40,
                                  fix_line="Payments show the shop's name", state="gated", created_at=timezone.now())


async def test_the_card_reaches_the_phone_and_a_signed_refusal_ends_the_candidate(owner: Any, make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    release = await db_async(candidate)()
    verdict = await db_async(baseline.check)(release, ["payments/services.py"], owner_id=owner.id)
    frame = await receive_until(comm, "release.card")
    assert frame["card_id"] == str(verdict.card.id) and frame["areas"] == ["payments"]
    assert frame["summary"] == "Payments show the shop's name"
    card = await db_async(lambda: type(verdict.card).objects.select_related("release").get(id=verdict.card.id))()
    await comm.send_json_to({"type": "release.answer", "id": "r1", "card_id": frame["card_id"], "answer": "refuse",
                             "signature": phone.sign(baseline.card_message(card, "refuse"))})
    result = await receive_until(comm, "release.result")
    assert result == {"type": "release.result", "id": "r1", "card_id": frame["card_id"], "state": "refused"}
    await db_async(release.refresh_from_db)()
    assert release.state == "refused"
    await comm.send_json_to({"type": "release.answer", "id": "r2", "card_id": frame["card_id"], "answer": "approve",
                             "signature": phone.sign(baseline.card_message(card, "approve"))})
    assert (await receive_until(comm, "error"))["code"] == "card_closed"
    await comm.disconnect()


async def test_a_phone_that_connects_later_gets_the_open_card(owner: Any, make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    release = await db_async(candidate)()
    verdict = await db_async(baseline.check)(release, ["devices/mac/relay.py"], owner_id=owner.id)
    comm, _ = await open_socket(phone)
    frame = await receive_until(comm, "release.card")
    assert frame["card_id"] == str(verdict.card.id) and frame["areas"] == ["Mac remote access"]
    await comm.disconnect()
