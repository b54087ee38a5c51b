from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from accounts.devices import PairingRequest, issue_pairing_code, pair_device
from accounts.models import Device, PairingCode
from tests.conftest import need, new_keypair, pairing_payload
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


def post_pair(body: dict[str, Any], ip: str = "10.0.0.1") -> Any:
    return Client().post("/api/pair/", body, content_type="application/json", REMOTE_ADDR=ip)


def test_pairing_with_a_fresh_code_creates_the_device(owner: Any) -> None:
    _, code = issue_pairing_code(owner)
    body, _ = pairing_payload(code, kind="phone", capture_channels=["phone_app"])
    response = post_pair(body)
    assert response.status_code == 201, response.content
    data = response.json()
    device = Device.objects.get(id=data["device_id"])
    assert device.owner == owner and device.kind == "phone" and device.capture_channels == ["phone_app"]
    assert device.public_key == body["public_key"] and not device.is_guest
    assert data["instance_public_key"] and data["protocol"] == 1


def test_pairing_code_is_single_use(owner: Any) -> None:
    _, code = issue_pairing_code(owner)
    assert post_pair(pairing_payload(code)[0]).status_code == 201
    second = post_pair(pairing_payload(code)[0])
    assert second.status_code == 400 and second.json()["error"]["code"] == "code_used"
    assert Device.objects.count() == 1


def test_expired_pairing_code_is_refused(owner: Any) -> None:
    pairing, code = issue_pairing_code(owner)
    PairingCode.objects.filter(id=pairing.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = post_pair(pairing_payload(code)[0])
    assert response.json()["error"]["code"] == "code_expired"
    assert Device.objects.count() == 0


def test_pairing_code_expires_after_ten_minutes(owner: Any) -> None:
    """On the test's clock: a code issued at ``issued`` pairs just before issued + 10 min
    and is ``code_expired`` at exactly issued + 10 min."""
    issued = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    pairing, late = issue_pairing_code(owner, now=issued)
    assert pairing.expires_at == issued + timedelta(minutes=10)
    with pytest.raises(YimiError) as err:
        pair_device(PairingRequest.from_payload(pairing_payload(late)[0]), client_ip="10.4.0.1", now=issued + timedelta(minutes=10))
    assert err.value.code == "code_expired"
    _, in_time = issue_pairing_code(owner, now=issued)
    device = pair_device(PairingRequest.from_payload(pairing_payload(in_time)[0]), client_ip="10.4.0.2", now=issued + timedelta(minutes=10, microseconds=-1))
    assert list(Device.objects.values_list("id", flat=True)) == [device.id]


def test_wrong_signature_is_refused_and_the_code_stays_usable(owner: Any) -> None:
    _, code = issue_pairing_code(owner)
    body, _ = pairing_payload(code)
    _, other_public = new_keypair()
    body["public_key"] = other_public  # signed with a different key than presented
    response = post_pair(body)
    assert response.status_code == 401 and response.json()["error"]["code"] == "bad_signature"
    assert Device.objects.count() == 0
    assert post_pair(pairing_payload(code)[0]).status_code == 201


def test_guessing_codes_is_rate_limited_per_address(owner: Any, settings: Any) -> None:
    for _ in range(settings.PAIRING_FAILURES_PER_IP):
        assert post_pair(pairing_payload("AAAA-AAAA")[0]).json()["error"]["code"] == "invalid_code"
    _, code = issue_pairing_code(owner)
    blocked = post_pair(pairing_payload(code)[0])
    assert blocked.status_code == 429 and blocked.json()["error"]["code"] == "rate_limited"
    assert Device.objects.count() == 0
    # another address is not blocked by this one's guesses
    assert post_pair(pairing_payload(code)[0], ip="10.0.0.2").status_code == 201


def test_guessing_codes_is_rate_limited_globally(owner: Any, settings: Any) -> None:
    settings.PAIRING_FAILURES_GLOBAL = 3
    for i in range(3):
        assert post_pair(pairing_payload("AAAA-AAAA")[0], ip=f"10.1.0.{i}").json()["error"]["code"] == "invalid_code"
    _, code = issue_pairing_code(owner)
    assert post_pair(pairing_payload(code)[0], ip="10.2.0.1").json()["error"]["code"] == "rate_limited"


def test_watch_must_relay_through_one_of_the_owners_phones(owner: Any, make_device: Any) -> None:
    _, code = issue_pairing_code(owner)
    missing = post_pair(pairing_payload(code, kind="watch")[0])
    assert missing.json()["error"]["code"] == "invalid_request"
    phone = make_device("phone")
    ok = post_pair(pairing_payload(code, kind="watch", relay_via=str(phone.device.id))[0])
    assert ok.status_code == 201
    assert Device.objects.get(id=ok.json()["device_id"]).relay_via == phone.device


@pytest.mark.parametrize(
    "change, code",
    [
        ({"kind": "toaster"}, "invalid_request"),
        ({"capture_channels": ["Bad Channel!"]}, "invalid_request"),
        ({"public_key": "not base64!"}, "invalid_public_key"),
        ({"name": ""}, "invalid_request"),
    ],
)
def test_bad_pairing_input_changes_nothing(owner: Any, change: dict[str, Any], code: str) -> None:
    _, pairing_code = issue_pairing_code(owner)
    body, _ = pairing_payload(pairing_code)
    body.update(change)
    response = post_pair(body)
    assert response.status_code in (400, 401) and response.json()["error"]["code"] == code
    assert Device.objects.count() == 0
    assert PairingCode.objects.get().used_at is None


def test_malformed_json_gets_a_stable_error(owner: Any) -> None:
    response = Client().post("/api/pair/", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_json"


def test_guest_code_pairs_a_guest_device(owner: Any) -> None:
    _, code = issue_pairing_code(owner, for_guest=True)
    response = post_pair(pairing_payload(code)[0])
    assert Device.objects.get(id=response.json()["device_id"]).is_guest


def guess(body: dict[str, Any], ip: str, now: Any = None) -> str:
    try:
        pair_device(PairingRequest.from_payload(body), client_ip=ip, **({"now": now} if now is not None else {}))
    except YimiError as exc:
        return exc.code
    return "paired"


def guess_at_once(bodies_and_ips: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Every guess on its own thread and database connection, released together."""
    from django.db import connection

    outcomes: list[str] = []
    start = threading.Barrier(len(bodies_and_ips))

    def one(body: dict[str, Any], ip: str) -> None:
        try:
            start.wait(timeout=30)
            outcomes.append(guess(body, ip))
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=pair) for pair in bodies_and_ips]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(outcomes) == len(bodies_and_ips)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_concurrent_guesses_from_one_address_count_at_most_the_limit(owner: Any, settings: Any) -> None:
    wrong = [(pairing_payload("AAAA-AAAA")[0], "10.3.0.1") for _ in range(24)]
    outcomes = guess_at_once(wrong)
    assert outcomes.count("invalid_code") == settings.PAIRING_FAILURES_PER_IP
    assert outcomes.count("rate_limited") == len(wrong) - settings.PAIRING_FAILURES_PER_IP
    _, code = issue_pairing_code(owner)
    assert guess(pairing_payload(code)[0], "10.3.0.1") == "rate_limited"


@pytest.mark.django_db(transaction=True)
def test_concurrent_guesses_from_everyone_count_at_most_the_global_limit(owner: Any, settings: Any) -> None:
    settings.PAIRING_FAILURES_GLOBAL = 3
    wrong = [(pairing_payload("AAAA-AAAA")[0], f"10.4.0.{i}") for i in range(12)]
    outcomes = guess_at_once(wrong)
    assert outcomes.count("invalid_code") == 3 and outcomes.count("rate_limited") == 9


class AsRead:
    """A query's answer as it was when it was read (``.first()``), whatever happened since."""

    def __init__(self, row: Any) -> None:
        self.row = row

    def first(self) -> Any:
        return self.row


@pytest.mark.django_db(transaction=True)
def test_a_code_used_by_another_device_between_the_read_and_the_claim_pairs_only_that_device(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race, made to happen every time: a second device pairs with the code, on its own
    thread and connection, after the first one read the code as unused and before it claimed
    it. The claim is conditional (``used_at IS NULL``): the first gets ``code_used`` and
    there is one device, the second's."""
    from django.db import connection

    need(connection.vendor == "postgresql", "on SQLite BEGIN IMMEDIATE holds the write lock from the read to the claim: the second pairing waits")
    _, code = issue_pairing_code(owner)
    first, second = pairing_payload(code)[0], pairing_payload(code)[0]
    read_code = PairingCode.objects.filter
    raced: list[str] = []

    def read_then_let_the_other_pair(*args: Any, **kwargs: Any) -> Any:
        found = read_code(*args, **kwargs)
        if "digest" not in kwargs or raced:
            return found
        row = found.first()  # the first device's read: not used yet
        raced.append("read")

        def other() -> None:
            try:
                raced.append(guess(second, "10.7.0.2"))
            finally:
                connection.close()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(60)
        assert raced == ["read", "paired"]  # committed before the first device claims
        return AsRead(row)

    monkeypatch.setattr(PairingCode.objects, "filter", read_then_let_the_other_pair)
    assert guess(first, "10.7.0.1") == "code_used"
    monkeypatch.undo()
    assert [d.public_key for d in Device.objects.all()] == [second["public_key"]]
    assert PairingCode.objects.get().used_by.public_key == second["public_key"]


def test_a_failed_guess_counts_for_ten_minutes(owner: Any, settings: Any) -> None:
    start = timezone.now()
    for _ in range(settings.PAIRING_FAILURES_PER_IP):
        assert guess(pairing_payload("AAAA-AAAA")[0], "10.5.0.1", now=start) == "invalid_code"
    _, code = issue_pairing_code(owner)
    almost = start + timedelta(seconds=settings.PAIRING_FAILURE_WINDOW_SECONDS - 1)
    assert guess(pairing_payload(code)[0], "10.5.0.1", now=almost) == "rate_limited"
    after = start + timedelta(seconds=settings.PAIRING_FAILURE_WINDOW_SECONDS + 1)
    PairingCode.objects.update(expires_at=after + timedelta(minutes=10))  # the code itself is still fresh then
    assert guess(pairing_payload(code)[0], "10.5.0.1", now=after) == "paired"


def test_right_codes_and_bad_input_are_not_counted_as_guesses(owner: Any, settings: Any) -> None:
    for _ in range(settings.PAIRING_FAILURES_PER_IP + 1):
        _, code = issue_pairing_code(owner)
        assert guess(pairing_payload(code)[0], "10.6.0.1") == "paired"
        bad = pairing_payload(code)[0] | {"kind": "toaster"}
        assert guess(bad, "10.6.0.1") == "invalid_request"
    _, code = issue_pairing_code(owner)
    assert guess(pairing_payload(code)[0], "10.6.0.1") == "paired"
