"""The release watchdog (flow F6): a process apart from Yimi that watches the version a
switch just brought in and takes it back to the previous one when it does not stay up.

The rule: with ``t_b`` the start of continuous unhealth and ``R_W(t)``
the restarts within the window ``W``,

    (t_b is set and t - t_b >= U) or R_W(t) >= L   ->   roll back, once.

``U``, ``W`` and ``L`` have no built-in defaults: they must come from the measured switch
and health-check times of the host (``Thresholds.from_values`` refuses without them).

The core is a pure state machine: ``step(state, observation, thresholds)`` returns the next
``WatchState`` and the ``Action``s to take; nothing here reads a clock, a file or a
service. ``run_once`` drives one tick with injected callables (observe, roll back, notify)
and a ``StateFile``; ``manage.py release_watchdog`` is the thin loop around it.

What makes it safe to restart at any moment:

- the rollback **intent** is part of the state the driver writes (atomically, fsynced)
  *before* it calls the rollback; a watchdog that starts and finds an intent only observes
  and notifies: it never switches a second time (tried once);
- a **third build** (current is neither the watched new build nor its previous one) means a
  newer release took over: the watch ends (``yielded``) and nothing is rolled back over it;
- notices are pending records in the state with a stable id, cleared only when delivered,
  and sent again with the same id after an interruption (the receiver drops repeats).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from yimi_project.errors import YimiError
from yimi_project.files import write_atomically

# The phases of one watch (one switch). ``watching`` and ``intent`` may still act or be
# observed; the others are ends: a new watch starts only when a new switch is seen.
WATCHING = "watching"
INTENT = "intent"  # the rollback intent is written; the rollback was (or is being) tried
ROLLED_BACK = "rolled_back"
ROLLBACK_FAILED = "rollback_failed"
STABLE = "stable"
YIELDED = "yielded"
ENDED = frozenset({ROLLED_BACK, ROLLBACK_FAILED, STABLE, YIELDED})

THRESHOLD_NAMES = {
    "U": "--unhealthy-seconds / YIMI_WATCHDOG_UNHEALTHY_SECONDS",
    "W": "--window-seconds / YIMI_WATCHDOG_WINDOW_SECONDS",
    "L": "--restart-limit / YIMI_WATCHDOG_RESTART_LIMIT",
}


@dataclass(frozen=True)
class Thresholds:
    """``U`` (seconds of continuous unhealth), ``W`` (the restart window, seconds) and ``L``
    (restarts within ``W``). There are no defaults, by design: they must be measured
    (docs/decisions/2026-12-03-watchdog-thresholds.md)."""

    unhealthy_seconds: float  # U
    window_seconds: float  # W
    restart_limit: int  # L

    @classmethod
    def from_values(cls, u: Any, w: Any, l: Any) -> Thresholds:  # noqa: E741 - the rule's names
        """Parse the three values; missing or invalid ones are named in one error."""
        given = {"U": u, "W": w, "L": l}
        missing = [name for name, value in given.items() if value is None or str(value).strip() == ""]
        if missing:
            raise YimiError(
                "watchdog_thresholds_missing",
                "the watchdog has no built-in U, W or L; missing: "
                + ", ".join(f"{name} ({THRESHOLD_NAMES[name]})" for name in missing)
                + ". Set them from the measured switch and health-check times (the docs use U=W=180 s, L=3 as an example).",
            )
        try:
            unhealthy, window, limit = float(u), float(w), int(str(l))
        except ValueError as exc:
            raise YimiError("invalid_request", f"U and W are seconds and L a whole number of restarts: {exc}") from exc
        if unhealthy <= 0 or window <= 0 or limit < 1:
            raise YimiError("invalid_request", "U and W must be more than 0 seconds and L at least 1")
        return cls(unhealthy, window, limit)

    @property
    def stable_after(self) -> float:
        """How long the new build must be healthy, with no restart within ``W``, to be stable."""
        return max(self.unhealthy_seconds, self.window_seconds)


@dataclass(frozen=True)
class Pointers:
    """The host's pointers as the watchdog reads them: ``switch_id`` names the switch that
    made ``current`` current ('' when no switch did: a first install is not watched)."""

    current: str | None
    previous: str | None
    switch_id: str


@dataclass(frozen=True)
class Observation:
    """One look at the host: when (seconds on the injected clock), the pointers, whether the
    services run healthy, and their restart counter (cumulative, as the runtime counts it)."""

    at: float
    pointers: Pointers
    healthy: bool
    restarts: int


@dataclass(frozen=True)
class Rollback:
    """Go back from ``from_build`` (which must still be current) to ``to_build``."""

    reason: str
    from_build: str
    to_build: str


@dataclass(frozen=True)
class Notice:
    notice_id: str
    code: str
    text: str


Action = Rollback | Notice


@dataclass
class WatchState:
    """One watch, as written to the state file (JSON)."""

    new_build: str
    previous_build: str
    switch_id: str
    started_at: float
    phase: str = WATCHING
    unhealthy_since: float | None = None  # t_b
    healthy_since: float | None = None
    restart_times: list[float] = field(default_factory=list)
    restarts_seen: int | None = None
    intent: dict[str, Any] | None = None
    outcome: str = ""
    pending_notices: list[dict[str, str]] = field(default_factory=list)
    sent_notices: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatchState:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def restarts_within(state: WatchState, now: float, window: float) -> int:
    """``R_W(t)``: restarts seen in ``(t - W, t]``."""
    return sum(1 for t in state.restart_times if now - window < t <= now)


def step(state: WatchState | None, obs: Observation, th: Thresholds) -> tuple[WatchState | None, list[Action]]:
    """The next state and what to do, from the previous state and one observation.

    Steps: 1. no watch, or an ended one and a build since that it did not know: watch it
    (when it has a previous build to go back to); 2. a third build: yield; 3. an intent found (this
    process or one before it tried the rollback): observe only: back on the previous build
    is ``rolled_back``, still on the new one ``rollback_failed`` (never tried again);
    4. watching: count new restarts, keep ``t_b``, and roll back when
    ``t - t_b >= U`` or ``R_W >= L``; the returned state already holds the intent, so the
    driver writes it before acting; 5. healthy for ``max(U, W)`` with no restart in ``W``:
    stable, the owner is told.
    """
    p = obs.pointers
    if state is None or (state.phase in ENDED and _new_switch(state, p)):
        if not p.current or not p.previous or not p.switch_id:
            return state, []  # nothing switched in (a first install is not watched), or nothing to go back to
        state = WatchState(new_build=p.current, previous_build=p.previous, switch_id=p.switch_id, started_at=obs.at,
                           restarts_seen=obs.restarts)
    else:
        state = replace(state, restart_times=list(state.restart_times), pending_notices=list(state.pending_notices),
                        sent_notices=list(state.sent_notices))
    if state.phase in ENDED:
        return state, _queue(state, [])

    watched = {state.new_build, state.previous_build}
    if p.current not in watched:
        state.phase, state.outcome = YIELDED, f"a newer release ({p.current}) took over"
        return state, _queue(state, [_notice(state, "watchdog_yielded",
            f"A newer release ({p.current}) took over from {state.new_build}; the watchdog does not roll it back.")])

    if state.phase == INTENT:
        if p.current == state.previous_build:
            state.phase, state.outcome = ROLLED_BACK, "back on the previous build"
            text = (f"Yimi went back to the previous version ({state.previous_build}): {state.intent and state.intent['reason']}. "
                    "Only code and configuration were replaced: the database was not restored and nothing done outside was undone.")
            return state, _queue(state, [_notice(state, "watchdog_rolled_back", text)])
        state.phase, state.outcome = ROLLBACK_FAILED, "the rollback was tried once and the new build is still current"
        return state, _queue(state, [_notice(state, "watchdog_rollback_failed",
            f"The automatic rollback from {state.new_build} was tried once and did not take; it is not tried again. "
            "An operator needs to look at the host (manage.py release status).")])

    if p.current != state.new_build:
        # Back on the previous build without the watchdog (an operator or a requested rollback).
        state.phase, state.outcome = YIELDED, "the previous build is current again without the watchdog"
        return state, _queue(state, [])

    _count_restarts(state, obs, th)
    if obs.healthy:
        state.unhealthy_since = None
        if state.healthy_since is None:
            state.healthy_since = obs.at
    else:
        state.healthy_since = None
        if state.unhealthy_since is None:
            state.unhealthy_since = obs.at
    r_w = restarts_within(state, obs.at, th.window_seconds)
    reason = ""
    if state.unhealthy_since is not None and obs.at - state.unhealthy_since >= th.unhealthy_seconds:
        reason = f"unhealthy for {obs.at - state.unhealthy_since:.0f} s (U = {th.unhealthy_seconds:g} s)"
    elif r_w >= th.restart_limit:
        reason = f"{r_w} restarts within {th.window_seconds:g} s (L = {th.restart_limit})"
    if reason:
        state.phase = INTENT
        state.intent = {"from": state.new_build, "to": state.previous_build, "reason": reason, "at": obs.at}
        return state, _queue(state, [Rollback(reason, state.new_build, state.previous_build)])
    if (state.healthy_since is not None and obs.at - state.healthy_since >= th.stable_after and r_w == 0):
        state.phase, state.outcome = STABLE, "healthy"
        return state, _queue(state, [_notice(state, "watchdog_stable",
            f"The new version ({state.new_build}) has been running healthy; the watchdog's watch is over.")])
    return state, _queue(state, [])


def rollback_done(state: WatchState, ok: bool, detail: str = "") -> WatchState:
    """After the one rollback attempt: the phase stays ``intent`` until an observation shows
    which build is current (``step`` decides ``rolled_back`` or ``rollback_failed``); a
    rollback that raised is recorded so the notice can say why."""
    state = replace(state, pending_notices=list(state.pending_notices))
    if not ok:
        state.outcome = f"the rollback did not complete: {detail}"[:300]
    return state


def _new_switch(state: WatchState, p: Pointers) -> bool:
    """A build the ended watch did not know is current: a newer release, to be watched.
    (Going back to the previous build after a rollback is not one: it is not watched, as
    there is nothing safer to go back to.)"""
    return bool(p.current) and p.current not in (state.new_build, state.previous_build)


def _count_restarts(state: WatchState, obs: Observation, th: Thresholds) -> None:
    if state.restarts_seen is not None and obs.restarts > state.restarts_seen:
        state.restart_times.extend([obs.at] * (obs.restarts - state.restarts_seen))
    state.restarts_seen = obs.restarts  # a lower counter is a recreated container: start from it
    state.restart_times = [t for t in state.restart_times if obs.at - th.window_seconds < t]


def _notice(state: WatchState, code: str, text: str) -> Notice:
    return Notice(f"{state.switch_id}:{code}", code, text)


def _queue(state: WatchState, actions: list[Action]) -> list[Action]:
    """Notices go into the state as pending (sent by the driver, cleared when delivered);
    the returned actions are the rollback, if any, then every notice still pending."""
    for action in actions:
        if isinstance(action, Notice) and action.notice_id not in state.sent_notices and all(
            n["notice_id"] != action.notice_id for n in state.pending_notices
        ):
            state.pending_notices.append({"notice_id": action.notice_id, "code": action.code, "text": action.text})
    rollbacks: list[Action] = [a for a in actions if isinstance(a, Rollback)]
    return rollbacks + [Notice(**n) for n in state.pending_notices]


# --- the state file ---------------------------------------------------------------------------------


class StateFile:
    """The watchdog's state on disk: JSON, replaced atomically (temporary file in the same
    directory, fsync, ``os.replace``, fsync of the directory), so a crash leaves the old
    state or the new one, never half of one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> WatchState | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise YimiError("watchdog_state_unreadable", f"the watchdog state file cannot be read ({exc}); nothing was done") from exc
        return WatchState.from_json(data) if data else None

    def save(self, state: WatchState | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = json.dumps(state.to_json() if state else None, sort_keys=True, indent=1)
        write_atomically(self.path, text.encode(), mode=0o600)


# --- one tick ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    state: WatchState | None
    rolled_back: bool
    notices_sent: list[str]


def run_once(
    store: StateFile,
    observe: Callable[[], Observation],
    rollback: Callable[[Rollback], Any],
    notify: Callable[[Notice], bool],
    thresholds: Thresholds,
) -> Tick:
    """One tick of the watchdog.

    Steps: 1. load the state and observe; 2. ``step``; 3. write the new state (with the
    intent, if it decided to roll back) before anything is done; 4. roll back (once: a
    later tick, or a restarted watchdog, finds the intent and only observes); 5. send the
    pending notices and clear each one that was delivered.
    """
    state, actions = step(store.load(), observe(), thresholds)
    store.save(state)
    rolled = False
    for action in actions:
        if isinstance(action, Rollback) and state is not None:
            try:
                rollback(action)
                rolled = True
            except Exception as exc:  # noqa: BLE001 - recorded and told; never tried again
                state = rollback_done(state, False, f"{type(exc).__name__}: {exc}")
                store.save(state)
    sent = _deliver(store, state, [a for a in actions if isinstance(a, Notice)], notify)
    return Tick(store.load(), rolled, sent)


def _deliver(store: StateFile, state: WatchState | None, notices: Iterable[Notice], notify: Callable[[Notice], bool]) -> list[str]:
    sent: list[str] = []
    for notice in notices:
        try:
            delivered = notify(notice)
        except Exception:  # noqa: BLE001 - stays pending; sent again with the same id next tick
            delivered = False
        if delivered and state is not None:
            state.pending_notices = [n for n in state.pending_notices if n["notice_id"] != notice.notice_id]
            state.sent_notices.append(notice.notice_id)
            sent.append(notice.notice_id)
    if sent:
        store.save(state)
    return sent
