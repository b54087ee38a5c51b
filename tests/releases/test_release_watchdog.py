"""The release watchdog (flow F6): the pure state machine driven tick by tick with an
injected clock, injected health and restart counts, and a real state file on disk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from releases.watchdog import (
    INTENT,
    ROLLBACK_FAILED,
    ROLLED_BACK,
    STABLE,
    WATCHING,
    YIELDED,
    Notice,
    Observation,
    Pointers,
    Rollback,
    StateFile,
    Thresholds,
    run_once,
)
from yimi_project.errors import YimiError

TH = Thresholds(unhealthy_seconds=180, window_seconds=180, restart_limit=3)


@dataclass
class Host:
    """What the watchdog observes: the pointers, health and a restart counter, and what it
    did to them (the rollback swaps the pointers, like the release helper's)."""

    current: str = "B"
    previous: str | None = "A"
    healthy: bool = True
    restarts: int = 0
    now: float = 1000.0
    rollbacks: list[str] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    deliver: bool = True
    rollback_works: bool = True

    def observe(self) -> Observation:
        return Observation(self.now, Pointers(self.current, self.previous, f"switch-{self.current}"), self.healthy, self.restarts)

    def rollback(self, action: Rollback) -> None:
        assert (action.from_build, action.to_build) == (self.current, self.previous)
        self.rollbacks.append(action.reason)
        if not self.rollback_works:
            raise RuntimeError("the previous build did not start")
        assert self.previous is not None
        self.current, self.previous = self.previous, self.current

    def notify(self, notice: Notice) -> bool:
        if self.deliver:
            self.notices.append(notice)
        return self.deliver


def tick(host: Host, store: StateFile, seconds: float = 0.0):
    host.now += seconds
    return run_once(store, host.observe, host.rollback, host.notify, TH)


@pytest.fixture
def store(tmp_path: Path) -> StateFile:
    return StateFile(tmp_path / "watchdog" / "state.json")


def test_unhealthy_for_u_triggers_exactly_one_rollback(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    host.healthy = False
    tick(host, store)  # t_b
    tick(host, store, 179)
    assert host.rollbacks == [] and store.load().phase == WATCHING
    result = tick(host, store, 1)  # t - t_b = U
    assert result.rolled_back and len(host.rollbacks) == 1 and "unhealthy for 180 s" in host.rollbacks[0]
    assert (host.current, host.previous) == ("A", "B")
    for _ in range(5):  # still unhealthy, any number of ticks later: never a second switch
        tick(host, store, 60)
    assert len(host.rollbacks) == 1
    state = store.load()
    assert state.phase == ROLLED_BACK and state.intent["to"] == "A"
    told = [n for n in host.notices if n.code == "watchdog_rolled_back"]
    assert len(told) == 1 and "database was not restored" in told[0].text


def test_intent_survives_a_watchdog_restart_without_a_second_switch(store: StateFile, tmp_path: Path) -> None:
    host = Host(healthy=False)
    tick(host, store)

    def dies_after_intent(action: Rollback) -> None:
        on_disk = StateFile(store.path).load()  # what a restarted watchdog would read
        assert on_disk.phase == INTENT and on_disk.intent["reason"] == action.reason
        raise SystemExit("killed while switching")

    host.now += 180
    with pytest.raises(SystemExit):
        run_once(store, host.observe, dies_after_intent, host.notify, TH)
    assert (host.current, host.previous) == ("B", "A")  # it died before the switch

    restarted = StateFile(Path(str(store.path)))  # a new process: only the file is left
    for _ in range(3):
        tick(host, restarted, 30)
    assert host.rollbacks == []  # the restarted watchdog never switches
    state = restarted.load()
    assert state.phase == ROLLBACK_FAILED
    assert [n.code for n in host.notices] == ["watchdog_rollback_failed"]


def test_intent_found_after_restart_when_the_switch_happened_only_notifies(store: StateFile) -> None:
    host = Host(healthy=False)
    tick(host, store)
    tick(host, store, 200)
    assert len(host.rollbacks) == 1
    # the process restarts; the previous build is current; it observes and tells, once
    tick(host, StateFile(store.path), 5)
    tick(host, StateFile(store.path), 5)
    assert len(host.rollbacks) == 1
    assert [n.code for n in host.notices] == ["watchdog_rolled_back"]


def test_l_restarts_within_w_trigger(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    for _ in range(2):
        host.restarts += 1
        tick(host, store, 30)
    assert host.rollbacks == []
    host.restarts += 1
    result = tick(host, store, 30)  # the third restart within 180 s
    assert result.rolled_back and "3 restarts within 180 s" in host.rollbacks[0]


def test_restarts_spread_wider_than_w_do_not_trigger(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    for _ in range(6):
        host.restarts += 1
        tick(host, store, 100)  # never three within 180 s
    assert host.rollbacks == []


def test_a_third_build_stops_it(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    host.healthy = False
    tick(host, store, 10)
    host.current, host.previous = "C", "B"  # a newer release took over
    tick(host, store, 10)
    state = store.load()
    assert state.phase == YIELDED and state.new_build == "B"
    assert [n.code for n in host.notices] == ["watchdog_yielded"]
    # C is now watched on its own; B's unhealth never rolls C back to A
    tick(host, store, 170)
    assert host.rollbacks == [] and store.load().new_build == "C"


def test_a_third_build_after_the_intent_is_not_overridden(store: StateFile) -> None:
    host = Host(healthy=False, rollback_works=False)
    tick(host, store)
    tick(host, store, 180)
    assert len(host.rollbacks) == 1 and store.load().phase == INTENT
    host.current, host.previous = "C", "B"
    tick(host, store, 1)
    assert store.load().phase == YIELDED and len(host.rollbacks) == 1


def test_healthy_flapping_below_thresholds_does_nothing(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    for i in range(20):  # unhealthy for 170 s, then healthy again; two restarts per 200 s
        host.healthy = i % 2 == 0
        if i % 4 == 0:
            host.restarts += 1
        tick(host, store, 170 if not host.healthy else 30)
    assert host.rollbacks == []
    assert store.load().phase == WATCHING


def test_healthy_for_the_stable_period_tells_the_owner_once(store: StateFile) -> None:
    host = Host()
    tick(host, store)
    tick(host, store, 179)
    assert store.load().phase == WATCHING
    tick(host, store, 1)
    tick(host, store, 60)
    assert store.load().phase == STABLE
    assert [n.code for n in host.notices] == ["watchdog_stable"]


def test_an_undelivered_notice_is_sent_again_with_the_same_id(store: StateFile) -> None:
    host = Host(deliver=False)
    tick(host, store)
    tick(host, store, 180)
    assert store.load().pending_notices  # stable, but not told yet
    host.deliver = True
    tick(host, store, 10)
    tick(host, store, 10)
    assert [n.notice_id for n in host.notices] == ["switch-B:watchdog_stable"]
    assert store.load().pending_notices == []


def test_nothing_to_go_back_to_is_not_watched(store: StateFile) -> None:
    host = Host(previous=None, healthy=False)
    tick(host, store)
    tick(host, store, 1000)
    assert host.rollbacks == [] and store.load() is None


def test_a_release_no_switch_brought_in_is_not_watched(store: StateFile) -> None:
    host = Host(healthy=False)

    def observe() -> Observation:
        return Observation(host.now, Pointers(host.current, host.previous, ""), host.healthy, host.restarts)

    run_once(store, observe, host.rollback, host.notify, TH)
    host.now += 1000
    run_once(store, observe, host.rollback, host.notify, TH)
    assert host.rollbacks == [] and store.load() is None


@pytest.mark.parametrize(
    ("u", "w", "l", "missing"),
    [(None, None, None, ["U", "W", "L"]), ("180", None, "3", ["W"]), ("180", "180", "", ["L"])],
)
def test_refuses_without_u_w_l(u: str | None, w: str | None, l: str | None, missing: list[str]) -> None:  # noqa: E741
    with pytest.raises(YimiError) as err:
        Thresholds.from_values(u, w, l)
    assert err.value.code == "watchdog_thresholds_missing"
    for name in missing:
        assert f"{name} (" in err.value.message
    for name in {"U", "W", "L"} - set(missing):
        assert f"{name} (" not in err.value.message


def test_invalid_thresholds_are_refused() -> None:
    with pytest.raises(YimiError):
        Thresholds.from_values("0", "180", "3")
    with pytest.raises(YimiError):
        Thresholds.from_values("180", "180", "three")
    assert Thresholds.from_values("180", "60", "3") == Thresholds(180.0, 60.0, 3)


def test_a_corrupt_state_file_is_an_error_not_a_fresh_start(store: StateFile) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_text("{not json")
    with pytest.raises(YimiError) as err:
        store.load()
    assert err.value.code == "watchdog_state_unreadable"
