"""L3 assertions: compare-and-set commits under the owner's lock, replay by request id,
re-evaluation marks, forgetting through historical dependencies (flow F7)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connection, transaction

from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest, Dependency
from memory.locks import MEMORY_LOCK_SPACE, lock_owner_memory
from memory.models import (
    Assertion,
    AssertionDependency,
    AssertionVersion,
    MemoryReceipt,
)
from memory.timeline.entries import append_entry
from tests.conftest import need
from yimi_project.errors import YimiError


def commit(owner: Any, payload: Any = None, *, expected: int = 0, aid: Any = None, predicate: str = "preference.food",
           deps: tuple[tuple[Any, int], ...] = (), evidence: tuple[int, ...] = (), request_id: str | None = None,
           actor: str = "agent") -> assertions.CommitResult:
    return assertions.commit(
        CommitRequest(
            owner_id=owner.pk, request_id=request_id or uuid.uuid4().hex, predicate=predicate,
            payload={"text": "不吃香菜"} if payload is None else payload, expected_version=expected,
            assertion_id=uuid.UUID(str(aid)) if aid else None, evidence=evidence,
            depends_on=tuple(Dependency(uuid.UUID(str(a)), v) for a, v in deps), actor=actor,
        )
    )


def refused(code: str, fn: Any, *args: Any, **kwargs: Any) -> YimiError:
    with pytest.raises(YimiError) as exc:
        fn(*args, **kwargs)
    assert exc.value.code == code, (exc.value.code, exc.value.message)
    return exc.value


def at_version(owner: Any, n: int) -> str:
    first = commit(owner, {"text": "v1"})
    for v in range(2, n + 1):
        commit(owner, {"text": f"v{v}"}, expected=v - 1, aid=first.assertion_id)
    return first.assertion_id


# --- the assertion ---------------------------------------------------------------------------


def test_assertion_has_id_version_predicate_payload_evidence_and_dependencies(owner: Any) -> None:
    said = append_entry(owner_id=owner.pk, kind="utterance", text="我不吃香菜", scope="owner")
    base = commit(owner, {"text": "不吃香菜"}, evidence=(said.seq,))
    derived = commit(owner, {"text": "外卖备注不要香菜"}, predicate="habit.takeout_note", deps=((base.assertion_id, 1),))
    row = assertions.get(owner.pk, derived.assertion_id)
    assert uuid.UUID(row["id"]) and row["version"] == 1 and row["predicate"] == "habit.takeout_note"
    assert row["payload"] == {"text": "外卖备注不要香菜"}
    assert row["depends_on"] == [{"assertion_id": base.assertion_id, "version": 1}]
    assert assertions.get(owner.pk, base.assertion_id)["evidence"] == [said.seq]
    refused("invalid_request", commit, owner, evidence=(said.seq + 99,))  # evidence must be a real timeline entry


def test_commit_on_the_current_version_creates_the_next_version(owner: Any) -> None:
    aid = at_version(owner, 2)
    result = commit(owner, {"text": "香菜现在能吃了"}, expected=2, aid=aid)
    assert (result.version, result.replayed) == (3, False)
    assert list(AssertionVersion.objects.filter(assertion_id=aid).values_list("version", flat=True)) == [1, 2, 3]
    assert Assertion.objects.get(id=aid).current_version == 3


def test_second_commit_on_stale_version_conflicts_and_changes_nothing(owner: Any) -> None:
    aid = at_version(owner, 7)
    assert commit(owner, {"text": "first"}, expected=7, aid=aid).version == 8
    error = refused("conflict", commit, owner, {"text": "second"}, expected=7, aid=aid)
    assert error.details == {"current_version": 8}
    assert AssertionVersion.objects.filter(assertion_id=aid).count() == 8
    assert assertions.get(owner.pk, aid)["payload"] == {"text": "first"}


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_commits_on_version_7_one_wins_with_8_the_other_conflicts(owner: Any) -> None:
    """Two real connections (threads) commit on version 7 at the same moment."""
    aid = at_version(owner, 7)
    barrier, outcomes = threading.Barrier(2), []

    def writer(text: str) -> None:
        try:
            barrier.wait()
            outcomes.append(commit(owner, {"text": text}, expected=7, aid=aid).version)
        except YimiError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(t,)) for t in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes, key=str) == [8, "conflict"]
    assert AssertionVersion.objects.filter(assertion_id=aid).count() == 8
    assert Assertion.objects.get(id=aid).current_version == 8


@pytest.mark.django_db(transaction=True)
def test_commit_waits_for_the_owners_advisory_lock(owner: Any) -> None:
    """PostgreSQL: a commit queues on pg_advisory_xact_lock(space, owner) held by another
    connection, and proceeds when that transaction ends."""
    need(connection.vendor == "postgresql", "advisory locks need PostgreSQL (DATABASE_URL)")
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                lock_owner_memory(owner.pk)
                held.set()
                release.wait(60)  # until the test has seen the writer queue (60 s only bound a failure)
        finally:
            connection.close()

    def writer() -> None:
        try:
            commit(owner, {"text": "after the lock"})
            done.set()
        finally:
            connection.close()

    lock_thread = threading.Thread(target=holder)
    lock_thread.start()
    assert held.wait(60)
    write_thread = threading.Thread(target=writer)
    write_thread.start()
    deadline = time.monotonic() + 60  # seen, not timed: the 60 s only bound a failure
    waiting = 0
    while time.monotonic() < deadline and not waiting:
        with connection.cursor() as cursor:
            cursor.execute(  # this database's lock only: other test runs may share the server
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [MEMORY_LOCK_SPACE, owner.pk],
            )
            waiting = cursor.fetchone()[0]
        time.sleep(0.02)
    assert waiting == 1 and not done.is_set()
    release.set()
    lock_thread.join(60)
    write_thread.join(60)
    assert done.is_set() and Assertion.objects.filter(owner=owner).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_memory_lock_is_only_taken_inside_a_transaction(owner: Any) -> None:
    with pytest.raises(RuntimeError):
        lock_owner_memory(owner.pk)


# --- replay by request id --------------------------------------------------------------------------


def test_retried_request_id_returns_the_original_result_not_a_second_version(owner: Any) -> None:
    aid = at_version(owner, 1)
    first = commit(owner, {"text": "v2"}, expected=1, aid=aid, request_id="req-42")
    again = commit(owner, {"text": "v2"}, expected=1, aid=aid, request_id="req-42")
    assert again.replayed and not first.replayed
    assert (again.assertion_id, again.version, again.committed_at) == (first.assertion_id, 2, first.committed_at)
    assert AssertionVersion.objects.filter(assertion_id=aid).count() == 2


def test_request_id_reused_for_a_different_request_is_refused(owner: Any) -> None:
    commit(owner, {"text": "a"}, request_id="req-1")
    refused("request_id_reused", commit, owner, {"text": "b"}, request_id="req-1")
    assert Assertion.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_of_one_request_write_one_version(owner: Any) -> None:
    barrier, results = threading.Barrier(2), []

    def retry() -> None:
        try:
            barrier.wait()
            results.append(commit(owner, {"text": "same"}, request_id="net-retry"))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.replayed for r in results) == [False, True]
    assert len({r.assertion_id for r in results}) == 1
    assert Assertion.objects.count() == 1 and AssertionVersion.objects.count() == 1


# --- re-evaluation -----------------------------------------------------------------------------


def chain(owner: Any, n: int = 4) -> list[str]:
    ids = [commit(owner, {"text": "link 0"}).assertion_id]
    for i in range(1, n):
        ids.append(commit(owner, {"text": f"link {i}"}, predicate="chain.link", deps=((ids[-1], 1),)).assertion_id)
    return ids


def test_a_change_marks_every_current_downstream_assertion_across_a_chain(owner: Any) -> None:
    a, b, c, d = chain(owner, 4)
    unrelated = commit(owner, {"text": "unrelated"}).assertion_id
    result = commit(owner, {"text": "link 0, changed"}, expected=1, aid=a)
    assert sorted(result.marked_for_reevaluation) == sorted([b, c, d])
    marked = set(Assertion.objects.filter(needs_reevaluation=True).values_list("id", flat=True))
    assert {str(m) for m in marked} == {b, c, d}
    assert not Assertion.objects.get(id=unrelated).needs_reevaluation
    assert not Assertion.objects.get(id=a).needs_reevaluation
    assert "changed to version 2" in Assertion.objects.get(id=d).reevaluation_reason


def test_the_reevaluation_mark_never_negates_a_conclusion(owner: Any) -> None:
    a, b = chain(owner, 2)
    before = assertions.get(owner.pk, b)
    commit(owner, {"text": "香菜现在能吃了"}, expected=1, aid=a)
    after = assertions.get(owner.pk, b)
    assert after["needs_reevaluation"] is True
    assert (after["payload"], after["version"], after["state"]) == (before["payload"], before["version"], "active")
    assert AssertionVersion.objects.filter(assertion_id=b).count() == 1


def test_marks_follow_only_current_dependencies(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "b restated without a"}, expected=1, aid=b, predicate="chain.link")  # v2 depends on nothing
    commit(owner, {"text": "a changed"}, expected=1, aid=a)
    assert not Assertion.objects.get(id=b).needs_reevaluation


def test_a_new_version_clears_its_own_mark(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "a changed"}, expected=1, aid=a)
    assert Assertion.objects.get(id=b).needs_reevaluation
    commit(owner, {"text": "b re-evaluated"}, expected=1, aid=b, predicate="chain.link", deps=((a, 2),))
    assert not Assertion.objects.get(id=b).needs_reevaluation


def test_a_conclusion_from_an_older_version_is_marked_at_once(owner: Any) -> None:
    a = at_version(owner, 2)
    late = commit(owner, {"text": "read v1 only"}, predicate="chain.link", deps=((a, 1),))
    row = Assertion.objects.get(id=late.assertion_id)
    assert row.needs_reevaluation and "older version" in row.reevaluation_reason


def test_marking_terminates_on_a_dependency_cycle(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "a from b"}, expected=1, aid=a, deps=((b, 1),))  # a v2 ← b v1 ← a v1: a cycle
    result = commit(owner, {"text": "b again"}, expected=1, aid=b, predicate="chain.link")
    assert result.marked_for_reevaluation == [a]


# --- forgetting ----------------------------------------------------------------------------------


def test_forgetting_follows_historical_dependencies(owner: Any) -> None:
    a, b, c = chain(owner, 3)
    # b's current version no longer depends on a, but its first version did
    commit(owner, {"text": "b restated"}, expected=1, aid=b, predicate="chain.link")
    other = commit(owner, {"text": "unrelated"}).assertion_id
    assert assertions.affected_by_forgetting(uuid.UUID(a)) == {uuid.UUID(x) for x in (a, b, c)}
    result = assertions.forget(owner.pk, a, request_id="f-1")
    assert {f["id"] for f in result.forgotten} == {a, b, c}
    assert Assertion.objects.get(id=other).state == "active"


def test_forgetting_erases_the_payload_of_every_version_and_keeps_a_tombstone(owner: Any) -> None:
    said = append_entry(owner_id=owner.pk, kind="utterance", text="我不吃香菜", scope="owner")
    a = commit(owner, {"text": "v1"}, evidence=(said.seq,)).assertion_id
    commit(owner, {"text": "v2"}, expected=1, aid=a)
    b = commit(owner, {"text": "derived"}, predicate="chain.link", deps=((a, 2),)).assertion_id
    assertions.forget(owner.pk, a, request_id="f-2")
    for aid, versions in ((a, 2), (b, 1)):
        tomb = Assertion.objects.get(id=aid)
        assert (tomb.state, tomb.summary, tomb.current_version) == ("forgotten", "", versions)
        assert tomb.forgotten_at is not None and tomb.forgotten_by == "f-2"
        rows = list(AssertionVersion.objects.filter(assertion_id=aid).values_list("version", "payload", "evidence", "erased"))
        assert rows == [(v, None, [], True) for v in range(1, versions + 1)]
    assert AssertionDependency.objects.filter(downstream_id=b).count() == 1  # the tombstone's structure stays
    history = assertions.history(owner.pk, a)
    assert [v["payload"] for v in history["versions"]] == [None, None]


def test_a_commit_to_a_forgotten_assertion_is_refused_with_forgotten(owner: Any) -> None:
    a, b = chain(owner, 2)
    assertions.forget(owner.pk, a, request_id="f-3")
    for aid, expected in ((a, 1), (b, 1)):
        refused("forgotten", commit, owner, {"text": "again"}, expected=expected, aid=aid, predicate="chain.link" if aid == b else "preference.food")
    refused("forgotten", commit, owner, {"text": "new, from a forgotten one"}, predicate="chain.link", deps=((a, 1),))
    assert AssertionVersion.objects.filter(assertion_id__in=[a, b], erased=False).count() == 0


def test_the_forget_result_says_exactly_what_was_erased_and_never_claims_l4_l5_or_backups(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "a v2"}, expected=1, aid=a)
    body = assertions.forget(owner.pk, a, request_id="f-4").payload()
    assert body["forgotten"] == [
        {"id": a, "predicate": "preference.food", "versions_erased": 2, "role": "target"},
        {"id": b, "predicate": "chain.link", "versions_erased": 1, "role": "dependent"},
    ]
    assert (body["assertions_forgotten"], body["versions_erased"], body["already_forgotten"]) == (2, 3, False)
    assert "L3" in body["erased"]
    claims = f"{body['erased']} {body['kept']}".lower()
    for layer in ("l4", "l5", "timeline", "backup", "original"):
        assert layer not in claims
    assert any("L4" in n for n in body["not_erased"]) and any("L5" in n for n in body["not_erased"])
    assert any("backups" in n for n in body["not_erased"])
    again = assertions.forget(owner.pk, a, request_id="f-5")  # already forgotten: nothing more erased
    assert again.already_forgotten and again.forgotten == [] and again.versions_erased == 0


def test_a_retried_forget_returns_the_original_result(owner: Any) -> None:
    (a,) = chain(owner, 1)
    first = assertions.forget(owner.pk, a, request_id="f-6")
    again = assertions.forget(owner.pk, a, request_id="f-6")
    assert again.replayed and again.forgotten == first.forgotten and again.forgotten_at == first.forgotten_at
    assert MemoryReceipt.objects.filter(request_id="f-6").count() == 1


def test_forgetting_terminates_on_a_dependency_cycle(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "a from b"}, expected=1, aid=a, deps=((b, 1),))
    result = assertions.forget(owner.pk, b, request_id="f-7")
    assert {f["id"] for f in result.forgotten} == {a, b}


def test_the_forget_preview_lists_everything_that_will_be_forgotten(owner: Any) -> None:
    a, b, c = chain(owner, 3)
    preview = assertions.forget_preview(owner.pk, a)
    assert [str(x.id) for x in preview.affected][0] == a
    assert {str(x.id) for x in preview.affected} == {a, b, c}
    assert Assertion.objects.filter(state="active").count() == 3  # the preview changed nothing
    assert {f["id"] for f in assertions.forget(owner.pk, a, request_id="f-8").forgotten} == {str(x.id) for x in preview.affected}


# --- input and owners ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"predicate": "Food Preference"},
        {"request_id": ""},
        {"request_id": "x" * 65},
        {"payload": None},
        {"payload": {"text": "x" * 20000}},
        {"expected_version": -1},
        {"predicate": "core_profile.entry", "payload": {"text": "x", "doc": "diary"}},
        {"predicate": "core_profile.entry", "payload": "just text"},
        {"actor": "someone"},
    ],
)
def test_bad_input_is_refused_and_changes_nothing(owner: Any, change: dict[str, Any]) -> None:
    fields = {"owner_id": owner.pk, "request_id": "r", "predicate": "preference.food", "payload": {"text": "x"}, "expected_version": 0, **change}
    refused("invalid_request", assertions.commit, CommitRequest(**fields))
    assert not Assertion.objects.exists() and not MemoryReceipt.objects.exists()


def test_a_dependency_must_exist_and_not_be_itself(owner: Any) -> None:
    a = commit(owner).assertion_id
    refused("invalid_request", commit, owner, deps=((uuid.uuid4(), 1),))
    refused("invalid_request", commit, owner, deps=((a, 2),))  # no version 2
    refused("invalid_request", commit, owner, {"text": "x"}, expected=1, aid=a, deps=((a, 1),))


def test_the_predicate_of_an_assertion_does_not_change(owner: Any) -> None:
    a = commit(owner).assertion_id
    refused("invalid_request", commit, owner, expected=1, aid=a, predicate="preference.drink")


def test_another_owners_assertions_are_not_found(owner: Any, django_user_model: Any) -> None:
    a = commit(owner).assertion_id
    stranger = django_user_model.objects.create_user("stranger", password="pw-pw-pw-pw")
    refused("not_found", assertions.get, stranger.pk, a)
    refused("not_found", assertions.history, stranger.pk, a)
    refused("not_found", assertions.forget, stranger.pk, a, request_id="x")
    refused("not_found", commit, stranger, {"text": "mine now"}, expected=1, aid=a)
    assert Assertion.objects.get(id=a).state == "active"


def test_query_filters_by_predicate_prefix_text_and_mark(owner: Any) -> None:
    a, b = chain(owner, 2)
    commit(owner, {"text": "喜欢喝冰美式"}, predicate="preference.drink")
    commit(owner, {"text": "a changed"}, expected=1, aid=a)
    assert {r["predicate"] for r in assertions.query(owner.pk, prefix="preference.")} == {"preference.food", "preference.drink"}
    assert [r["payload"]["text"] for r in assertions.query(owner.pk, text="冰美式")] == ["喜欢喝冰美式"]
    assert [r["id"] for r in assertions.query(owner.pk, needs_reevaluation=True)] == [b]
    assert [r["id"] for r in assertions.query(owner.pk, predicate="chain.link")] == [b]


def test_a_forget_that_leaves_any_payload_fails_and_forgets_nothing(owner: Any) -> None:
    """A database trigger (a stand-in for a storage fault) silently keeps one version's
    payload: the forget must notice, say so, and roll everything back."""
    a, b = chain(owner, 2)
    AssertionVersion.objects.filter(assertion_id=b).update(request_id="sticky")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION keep_sticky() RETURNS trigger AS $$ BEGIN "
                "IF OLD.request_id = 'sticky' THEN RETURN NULL; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute("CREATE TRIGGER keep_sticky BEFORE UPDATE ON memory_assertionversion FOR EACH ROW EXECUTE FUNCTION keep_sticky()")
        else:
            cursor.execute(
                "CREATE TRIGGER keep_sticky BEFORE UPDATE ON memory_assertionversion "
                "WHEN OLD.request_id = 'sticky' BEGIN SELECT RAISE(IGNORE); END"
            )
    error = refused("forget_incomplete", assertions.forget, owner.pk, a, request_id="f-9")
    assert "nothing was forgotten" in error.message
    assert set(Assertion.objects.values_list("state", flat=True)) == {"active"}
    assert AssertionVersion.objects.filter(erased=True).count() == 0 and not MemoryReceipt.objects.filter(request_id="f-9").exists()
