"""Voice identity rules (accounts.voiceprint, accounts.voice): enrollment, bands, thresholds,
trust windows, learning and call anchors. Rule boundaries use vectors at exact cosines;
the behaviour on real speech uses espeak-ng voices through the real speaker model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from accounts import voice, voiceprint
from accounts.models import (
    CallAnchor,
    ChannelThreshold,
    TrustWindow,
    VoiceprintEnrollment,
    VoiceprintSample,
)
from accounts.voiceprint import EnrollmentSegment
from tests.support import voice_support
from tests.support.voice_support import (
    GUEST_VOICE,
    OWNER_VOICE,
    SENTENCES,
    embed,
    unit_with_cosine,
)
from yimi_project.errors import YimiError

# fixtures
voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

pytestmark = pytest.mark.django_db
MODEL = "test-speaker@1"
DIM = 80


def basis(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim)
    v[i] = 1.0
    return v


B = basis(0)


def segments(vectors: list[np.ndarray], voiced_ms: int = 2000, quality: float = 1.0) -> list[EnrollmentSegment]:
    return [EnrollmentSegment(v.tolist(), voiced_ms, quality) for v in vectors]


def near(base: np.ndarray, cos: float, n: int, seed: int = 0) -> list[np.ndarray]:
    return [unit_with_cosine(base, cos, seed=seed + i) for i in range(n)]


def enroll(owner: Any, channel: str = "phone_app", base: np.ndarray = B) -> None:
    voiceprint.enroll_channel(owner.id, channel, MODEL, segments(near(base, 0.97, 5)))


def attest(sim: Any, *, attestation_id: str = "att-1", method: str = "face_id", issued_at: int | None = None) -> dict[str, Any]:
    issued = int(time.time()) if issued_at is None else issued_at
    message = voice.trust_window_message(str(sim.device.id), attestation_id, method, issued)
    return {"attestation_id": attestation_id, "method": method, "issued_at": issued, "signature": sim.sign(message)}


def decide(sim: Any, x: np.ndarray | None, *, at: Any = None, call: Any = None, mode: str = "normal", voiced_ms: int = 2000) -> voice.SpeakerDecision:
    return voice.decide_speaker(
        device=sim.device, embedding=x, model_key=MODEL, voiced_ms=voiced_ms, started_at=at or timezone.now(), call=call, mode=mode
    )


# --- enrollment -------------------------------------------------------------------------------


def test_enrollment_refuses_a_segment_under_1500_ms_voiced(owner: Any) -> None:
    segs = segments(near(B, 0.97, 5))
    segs[3] = EnrollmentSegment(segs[3].embedding, 1499)
    with pytest.raises(YimiError) as err:
        voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segs)
    assert err.value.code == "enrollment_segment_too_short" and err.value.details["segment"] == 3
    assert VoiceprintEnrollment.objects.count() == 0 and VoiceprintSample.objects.count() == 0
    segs[3] = EnrollmentSegment(segs[3].embedding, 1500)
    voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segs)
    assert VoiceprintEnrollment.objects.get().segment_count == 5


def test_enrollment_needs_at_least_5_segments(owner: Any) -> None:
    with pytest.raises(YimiError) as err:
        voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments(near(B, 0.97, 4)))
    assert err.value.code == "enrollment_too_few"
    assert VoiceprintEnrollment.objects.count() == 0


def test_enrollment_takes_at_most_20_segments(owner: Any) -> None:
    with pytest.raises(YimiError) as err:
        voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments(near(B, 0.97, 21)))
    assert err.value.code == "enrollment_too_many"
    assert VoiceprintEnrollment.objects.count() == 0
    voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments(near(B, 0.97, 20)))
    assert VoiceprintSample.objects.filter(source="enrolled").count() == 20


def test_leave_one_out_cosine_below_0_6_rejects_the_whole_set(owner: Any) -> None:
    enroll(owner)  # an existing enrollment must survive a rejected re-enrollment
    before = VoiceprintEnrollment.objects.get().centroid
    odd = [B, B, B, B, unit_with_cosine(B, 0.59)]
    with pytest.raises(YimiError) as err:
        voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments(odd))
    assert err.value.code == "enrollment_inconsistent" and err.value.details["segment"] == 4
    assert VoiceprintEnrollment.objects.get().centroid == before
    assert VoiceprintSample.objects.count() == 5
    voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments([B, B, B, B, unit_with_cosine(B, 0.61)]))


def test_leave_one_out_is_checked_only_within_a_channel(owner: Any) -> None:
    # The same person sounds very different on two channels (a cosine of 0.42 in one measurement):
    # each channel's set is checked on its own, so both enroll.
    enroll(owner, "phone_app", basis(0))
    enroll(owner, "glasses", basis(1))
    assert voiceprint.enrolled_channels(owner.id, MODEL) == ["glasses", "phone_app"]


def test_centroid_is_weighted_by_voiced_duration_times_quality(owner: Any) -> None:
    a, b = unit_with_cosine(B, 0.9, seed=1), unit_with_cosine(B, 0.9, seed=2)
    segs = [EnrollmentSegment(a.tolist(), 1500, 1.0)] * 4 + [EnrollmentSegment(b.tolist(), 6000, 0.8)]
    voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segs)
    stored = np.array(VoiceprintEnrollment.objects.get().centroid)
    expected = 4 * 1500 * 1.0 * a + 6000 * 0.8 * b
    assert np.allclose(stored, expected / np.linalg.norm(expected))
    unweighted = 4 * a + b
    assert not np.allclose(stored, unweighted / np.linalg.norm(unweighted), atol=1e-2)
    # doubling a segment's duration pulls as hard as doubling its quality
    longer = [EnrollmentSegment(a.tolist(), 1500, 1.0)] * 4 + [EnrollmentSegment(b.tolist(), 6000, 0.4)]
    better = [EnrollmentSegment(a.tolist(), 1500, 1.0)] * 4 + [EnrollmentSegment(b.tolist(), 3000, 0.8)]
    assert np.allclose(voiceprint.check_enrollment(longer), voiceprint.check_enrollment(better))
    assert not np.allclose(voiceprint.check_enrollment(longer), stored, atol=1e-2)


# --- scoring ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cos, band, scope",
    [(0.6501, "verified", "owner"), (0.6499, "uncertain", "owner_uncertain"), (0.4501, "uncertain", "owner_uncertain"), (0.4499, "unmatched", "guest")],
)
def test_bands_verified_from_0_65_uncertain_from_0_45_unmatched_below(make_device: Any, cos: float, band: str, scope: str) -> None:
    sim = make_device()
    voiceprint.enroll_channel(sim.device.owner_id, "phone_app", MODEL, segments([B] * 5))
    decision = decide(sim, unit_with_cosine(B, cos, seed=7))
    assert decision.band == band and decision.scope == scope
    assert decision.score == pytest.approx(cos, abs=1e-9)


def test_score_is_the_max_over_channels(owner: Any) -> None:
    enroll(owner, "phone_app", basis(0))
    enroll(owner, "glasses", basis(1))
    x = 0.2 * basis(0) + 0.9 * basis(1)
    result = voiceprint.match(owner.id, MODEL, x)
    assert result.verified and result.channel == "glasses"
    assert result.score == pytest.approx(max(result.scores.values()))
    assert result.scores["phone_app"] < 0.45 < 0.65 <= result.scores["glasses"]


def test_not_knowing_is_an_answer_never_closest_person_wins(make_device: Any) -> None:
    sim = make_device()
    nobody = decide(sim, B)
    assert (nobody.scope, nobody.reason) == ("owner_uncertain", "no_voiceprint")  # nothing enrolled: not known
    enroll(sim.device.owner)
    far = decide(sim, unit_with_cosine(B, 0.3))  # the best (only) candidate, and still a guest
    assert (far.scope, far.band) == ("guest", "unmatched")
    guest = make_device(guest=True)
    assert decide(guest, B).scope == "guest"  # a guest device never speaks as the owner


def test_real_owner_speech_is_verified_and_another_voice_is_unmatched(voice_catalog: dict[str, Any], make_device: Any) -> None:
    speech = voice_catalog["speech"]
    sim = make_device()
    owner_id = sim.device.owner_id
    key = "test-speaker@1"
    segs = [EnrollmentSegment(embed(speech.say(t)).tolist(), 2000, 1.0) for t in SENTENCES[:5]]
    voiceprint.enroll_channel(owner_id, "phone_app", key, segs)
    for text in SENTENCES[5:]:
        assert voiceprint.match(owner_id, key, embed(speech.say(text, OWNER_VOICE))).band == "verified"
        assert voiceprint.match(owner_id, key, embed(speech.say(text, GUEST_VOICE))).band == "unmatched"


# --- thresholds -------------------------------------------------------------------------------------


def test_threshold_is_never_below_the_0_65_floor(owner: Any, settings: Any) -> None:
    settings.VOICEPRINT_THRESHOLD = 0.5
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.65
    assert ChannelThreshold.objects.get().value == 0.65


def test_configured_threshold_raises_the_stored_value(owner: Any, settings: Any) -> None:
    settings.VOICEPRINT_THRESHOLD = 0.7
    voiceprint.enroll_channel(owner.id, "phone_app", MODEL, segments([B] * 5))
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.7
    x = unit_with_cosine(B, 0.68)  # would be verified at 0.65
    assert voiceprint.match(owner.id, MODEL, x).band == "uncertain"


def _subprocess_env() -> dict[str, str]:
    """Environment for a fresh process on the test database (the default config: 0.65)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{s['NAME']}"
    else:
        url = f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="yimi_project.settings")
    return env


@pytest.mark.django_db(transaction=True)
def test_threshold_never_lowers_across_restart_and_lower_config(owner: Any, settings: Any, tmp_path: Any) -> None:
    settings.VOICEPRINT_THRESHOLD = 0.72
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.72
    settings.VOICEPRINT_THRESHOLD = 0.6  # a lower configured value never lowers it
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.72
    # A restart: a new process with the default configuration (0.65) reads the stored value.
    env = _subprocess_env()
    env["YIMI_DATA_DIR"] = str(tmp_path)
    code = (
        "import django; django.setup(); from accounts.voiceprint import threshold; "
        f"print(threshold({owner.id}, 'phone_app', '{MODEL}'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=os.getcwd(), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) == 0.72
    assert ChannelThreshold.objects.get().value == 0.72


def test_threshold_rises_automatically_only_with_10_confirmed_samples(owner: Any) -> None:
    enroll(owner, base=B)
    learned = near(B, 0.9, 12, seed=100)  # confirmed samples scoring ≈0.9 against the enrollment
    for x in learned[:9]:
        assert voiceprint.add_learning_sample(owner.id, "phone_app", MODEL, x, voiced_ms=1200, quality=0.9).learned
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.65  # 9 are not enough
    outcome = voiceprint.add_learning_sample(owner.id, "phone_app", MODEL, learned[9], voiced_ms=1200, quality=0.9)
    assert outcome.threshold_raised_to == pytest.approx(0.70)  # at most +0.05 per step
    voiceprint.add_learning_sample(owner.id, "phone_app", MODEL, learned[10], voiced_ms=1200, quality=0.9)
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == pytest.approx(0.75)
    for _ in range(8):
        voiceprint.add_learning_sample(owner.id, "phone_app", MODEL, unit_with_cosine(B, 0.99, seed=_), voiced_ms=1200, quality=0.9)
    # never above the lowest confirmed score minus 0.05 (≈0.85 here), never above 0.85
    final = voiceprint.threshold(owner.id, "phone_app", MODEL)
    assert 0.75 < final <= 0.85


def test_threshold_does_not_rise_when_confirmed_samples_score_low(owner: Any) -> None:
    enroll(owner, base=B)
    rng = np.random.default_rng(5)
    for _ in range(12):  # the owner's confirmed speech scores only ≈0.68 on this channel
        side = basis(1) + 0.05 * rng.standard_normal(DIM) * (1 - B)
        x = 0.68 * B + np.sqrt(1 - 0.68**2) * side / np.linalg.norm(side)
        assert voiceprint.add_learning_sample(owner.id, "phone_app", MODEL, x, voiced_ms=1200, quality=0.9).learned
    assert voiceprint.threshold(owner.id, "phone_app", MODEL) == 0.65


# --- trust windows ------------------------------------------------------------------------------------


def test_trust_window_needs_a_fresh_signed_attestation_from_an_owner_device(make_device: Any) -> None:
    sim, other, guest = make_device(), make_device(), make_device(guest=True)
    with pytest.raises(YimiError) as err:
        voice.open_trust_window(sim.device, **{**attest(sim), "signature": attest(other)["signature"]})
    assert err.value.code == "bad_signature"
    with pytest.raises(YimiError) as err:
        voice.open_trust_window(sim.device, **attest(sim, issued_at=int(time.time()) - 120))
    assert err.value.code == "attestation_expired"
    with pytest.raises(YimiError) as err:
        voice.open_trust_window(guest.device, **attest(guest))
    assert err.value.code == "forbidden"
    assert TrustWindow.objects.count() == 0
    window = voice.open_trust_window(sim.device, **attest(sim))
    assert (window.expires_at - window.opened_at) == timedelta(seconds=60)
    with pytest.raises(YimiError) as err:
        voice.open_trust_window(sim.device, **attest(sim))  # the same attestation again
    assert err.value.code == "attestation_replayed"
    assert TrustWindow.objects.count() == 1


def test_trust_window_binds_a_call_until_hang_up(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner)
    stranger = unit_with_cosine(B, 0.2)  # not the owner by voiceprint
    window = voice.open_trust_window(sim.device, **attest(sim))
    t0 = window.opened_at
    call = voice.start_call(sim.device, "call-1", "phone_app")
    first = decide(sim, stranger, at=t0 + timedelta(seconds=10), call=call)
    assert (first.scope, first.reason, first.band) == ("owner", "trust_window_call", "unmatched")
    late = decide(sim, stranger, at=t0 + timedelta(seconds=300), call=call)  # long after the 60 s
    assert (late.scope, late.reason) == ("owner", "trust_window_call")
    # outside the call the window vouches for nothing
    assert decide(sim, stranger, at=t0 + timedelta(seconds=20)).scope == "guest"
    voice.end_call(call)
    assert decide(sim, stranger, at=t0 + timedelta(seconds=301), call=call).scope == "guest"


def test_trust_window_expires_after_60_seconds(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner)
    stranger = unit_with_cosine(B, 0.2)
    window = voice.open_trust_window(sim.device, **attest(sim))
    too_late = voice.start_call(sim.device, "late", "phone_app")
    assert decide(sim, stranger, at=window.opened_at + timedelta(seconds=60), call=too_late).scope == "guest"
    in_time = voice.start_call(sim.device, "in-time", "phone_app")
    assert decide(sim, stranger, at=window.opened_at + timedelta(seconds=59), call=in_time).scope == "owner"
    # one window vouches for one call
    another = voice.start_call(sim.device, "another", "phone_app")
    assert decide(sim, stranger, at=window.opened_at + timedelta(seconds=30), call=another).scope == "guest"


def test_payment_and_barge_in_modes_never_use_the_trust_window(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner)
    stranger = unit_with_cosine(B, 0.5)
    window = voice.open_trust_window(sim.device, **attest(sim))
    call = voice.start_call(sim.device, "c", "phone_app")
    at = window.opened_at + timedelta(seconds=5)
    assert decide(sim, stranger, at=at, call=call, mode="payment").scope == "owner_uncertain"
    assert decide(sim, stranger, at=at, call=call, mode="barge_in").scope == "owner_uncertain"
    assert TrustWindow.objects.get().bound_call is None  # not even bound by them
    assert decide(sim, stranger, at=at, call=call, mode="normal").scope == "owner"
    assert decide(sim, stranger, at=at, call=call, mode="payment").scope == "owner_uncertain"
    assert voice.learn_in_trust_window(
        device=sim.device, channel="phone_app", embedding=B, model_key=MODEL, voiced_ms=2000, quality=1.0, started_at=at, mode="payment"
    ) is None


# --- learning ------------------------------------------------------------------------------------------


def learn(sim: Any, x: np.ndarray, at: Any, *, voiced_ms: int = 1200, quality: float = 0.9, echo: bool = False) -> Any:
    return voice.learn_in_trust_window(
        device=sim.device, channel="phone_app", embedding=x, model_key=MODEL, voiced_ms=voiced_ms, quality=quality,
        started_at=at, echo=echo,
    )


def test_learning_sample_needs_1000_ms_quality_0_5_and_cosine_0_65_to_anchor_and_set(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner, base=basis(0))
    window = voice.open_trust_window(sim.device, **attest(sim))
    at = window.opened_at + timedelta(seconds=1)
    e1, e2 = basis(0), basis(1)
    assert learn(sim, e1, window.opened_at + timedelta(seconds=61)) is None  # outside the window
    assert learn(sim, e1, at, echo=True) is None  # Yimi's own echo
    assert learn(sim, e1, at, voiced_ms=999).reason == "too_short"
    assert learn(sim, e1, at, quality=0.49).reason == "low_quality"
    assert learn(sim, e1, at).reason == "anchor"
    assert learn(sim, 0.6 * e1 + 0.8 * e2, at).reason == "inconsistent_with_anchor"
    assert learn(sim, 0.7 * e1 + np.sqrt(1 - 0.49) * e2, at).reason == "learned"
    assert learn(sim, 0.66 * e1 - np.sqrt(1 - 0.66**2) * e2, at).reason == "inconsistent_with_set"
    samples = VoiceprintSample.objects.filter(source="learned").order_by("id")
    assert [s.is_anchor for s in samples] == [True, False]


def test_learning_stops_at_20_samples_per_channel(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner, "phone_app")
    enroll(sim.device.owner, "glasses")
    window = voice.open_trust_window(sim.device, **attest(sim))
    at = window.opened_at + timedelta(seconds=1)
    xs = near(B, 0.95, 21, seed=300)
    for x in xs[:20]:
        assert learn(sim, x, at).learned
    assert learn(sim, xs[20], at).reason == "learning_full"
    kept = VoiceprintSample.objects.filter(source="learned").order_by("id")
    assert kept.count() == 20 and np.allclose(kept.first().embedding, xs[0] / np.linalg.norm(xs[0]))  # no rolling replacement
    other_channel = voice.learn_in_trust_window(
        device=sim.device, channel="glasses", embedding=xs[20], model_key=MODEL, voiced_ms=1200, quality=0.9, started_at=at
    )
    assert other_channel.reason == "anchor"  # the cap is per channel


def test_learning_samples_and_the_anchor_need_the_uncertain_band_against_the_enrolled_centroid(make_device: Any) -> None:
    sim = make_device()
    voiceprint.enroll_channel(sim.device.owner_id, "phone_app", MODEL, segments([B] * 5))  # the enrolled centroid is B
    window = voice.open_trust_window(sim.device, **attest(sim))
    at = window.opened_at + timedelta(seconds=1)
    assert learn(sim, unit_with_cosine(B, 0.4499, seed=11), at).reason == "inconsistent_with_enrollment"
    assert not VoiceprintSample.objects.filter(source="learned").exists()  # a stranger does not set the anchor
    anchor = unit_with_cosine(B, 0.9, seed=12)
    assert learn(sim, anchor, at).reason == "anchor"
    side = (anchor - 0.9 * B) / np.linalg.norm(anchor - 0.9 * B)
    drift = np.cos(np.radians(65)) * B + np.sin(np.radians(65)) * side  # 0.42 to the enrollment, 0.78 to the anchor
    assert voiceprint.cosine(drift, anchor) >= 0.65
    assert learn(sim, drift, at).reason == "inconsistent_with_enrollment"
    assert learn(sim, unit_with_cosine(B, 0.88, seed=13), at).reason == "learned"
    assert VoiceprintSample.objects.filter(source="learned").count() == 2


def test_a_channel_without_an_enrollment_learns_nothing(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner, "glasses")
    window = voice.open_trust_window(sim.device, **attest(sim))
    assert learn(sim, B, window.opened_at + timedelta(seconds=1)).reason == "not_enrolled"  # nothing to judge it against
    assert not VoiceprintSample.objects.filter(source="learned").exists()


def test_a_stranger_in_the_trust_window_never_teaches_the_voiceprint(voice_catalog: dict[str, Any], make_device: Any) -> None:
    """Real speech through the real speaker model: inside the owner's trust window a guest
    speaks first. The window still admits the call, but the guest (unmatched against the
    channel's enrollment) becomes neither the anchor nor a learning sample, so the
    voiceprint does not move towards the guest; the owner's speech afterwards is learned."""
    speech = voice_catalog["speech"]
    sim = make_device()
    owner_id = sim.device.owner_id
    segs = [EnrollmentSegment(embed(speech.say(t)).tolist(), 2000, 1.0) for t in SENTENCES[:5]]
    voiceprint.enroll_channel(owner_id, "phone_app", MODEL, segs)
    issued = 1_700_000_000  # the clock is injected: no test depends on how fast this one runs
    window = voice.open_trust_window(sim.device, **attest(sim, issued_at=issued), now=datetime.fromtimestamp(issued, tz=UTC))
    at = window.opened_at + timedelta(seconds=2)
    call = voice.start_call(sim.device, "guest-first", "phone_app")
    probe = embed(speech.say(SENTENCES[7], GUEST_VOICE))
    guest_before = voiceprint.match(owner_id, MODEL, probe).score
    for text in SENTENCES[5:7]:
        x = embed(speech.say(text, GUEST_VOICE))
        decision = decide(sim, x, at=at, call=call)
        assert (decision.scope, decision.reason, decision.band) == ("owner", "trust_window_call", "unmatched")
        assert learn(sim, x, at).reason == "inconsistent_with_enrollment"
    assert not VoiceprintSample.objects.filter(source="learned").exists()
    assert voiceprint.match(owner_id, MODEL, probe).score == pytest.approx(guest_before)
    owner_speech = embed(speech.say(SENTENCES[7], OWNER_VOICE))
    assert learn(sim, owner_speech, at).reason == "anchor"
    assert learn(sim, embed(speech.say(SENTENCES[6], OWNER_VOICE)), at).reason == "learned"
    assert list(VoiceprintSample.objects.filter(source="learned").order_by("id").values_list("is_anchor", flat=True)) == [True, False]


# --- call anchors ------------------------------------------------------------------------------------


def test_call_anchor_is_set_by_voiceprint_verification_not_by_the_trust_window(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner)
    window = voice.open_trust_window(sim.device, **attest(sim))
    call = voice.start_call(sim.device, "c", "phone_app")
    at = window.opened_at + timedelta(seconds=2)
    assert decide(sim, unit_with_cosine(B, 0.3), at=at, call=call).reason == "trust_window_call"
    assert not CallAnchor.objects.exists()
    verified = unit_with_cosine(B, 0.9, seed=5)
    assert decide(sim, verified, at=at, call=call).reason == "voiceprint_verified"
    assert np.allclose(CallAnchor.objects.get(call=call).embedding, verified)


def test_call_anchor_recognizes_short_utterances_for_this_call_only(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner, base=basis(0))
    e1, e2 = basis(0), basis(1)
    verified = 0.9 * e1 + np.sqrt(1 - 0.81) * e2
    short = 0.5 * e1 + np.sqrt(0.75) * e2  # uncertain against the enrollment, 0.83 against the anchor
    call = voice.start_call(sim.device, "c1", "phone_app")
    assert decide(sim, verified, call=call).reason == "voiceprint_verified"
    answer = decide(sim, short, call=call, voiced_ms=300)
    assert (answer.scope, answer.reason, answer.band) == ("owner", "call_anchor", "uncertain")
    assert decide(sim, short, call=call, voiced_ms=199).scope == "owner_uncertain"  # under 200 ms voiced
    assert decide(sim, short, call=call, voiced_ms=300, mode="payment").scope == "owner_uncertain"
    other_call = voice.start_call(sim.device, "c2", "phone_app")
    assert decide(sim, short, call=other_call, voiced_ms=300).scope == "owner_uncertain"
    far = 0.3 * e1 - np.sqrt(1 - 0.09) * e2  # below 0.65 against the anchor
    assert decide(sim, far, call=call, voiced_ms=300).reason != "call_anchor"


def test_call_anchors_are_deleted_at_hang_up(make_device: Any) -> None:
    sim = make_device()
    enroll(sim.device.owner)
    call = voice.start_call(sim.device, "c", "phone_app")
    decide(sim, unit_with_cosine(B, 0.9), call=call)
    assert CallAnchor.objects.filter(call=call).exists()
    assert voice.end_call(call) is True
    assert not CallAnchor.objects.exists()
    assert voice.end_call(call) is False
    call.refresh_from_db()
    with pytest.raises(YimiError) as err:
        voice.start_call(sim.device, "c", "phone_app")
    assert err.value.code == "call_ended"
    assert decide(sim, unit_with_cosine(B, 0.5), call=call, voiced_ms=300).scope == "owner_uncertain"

