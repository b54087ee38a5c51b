"""Questions other authorities ask about voice identity (the payment authority's small
auto-pay needs "was this voice request verified by voiceprint?")."""

from __future__ import annotations

from accounts.models import AdmissionRecord

VOICEPRINT_VERIFIED = "voiceprint_verified"


def voice_request_verified(admission: AdmissionRecord) -> bool:
    """True only for a spoken request whose speaker the voiceprint verified as the owner
    (a trust window or a call anchor does not count: payments never use them)."""
    return (
        admission.channel == AdmissionRecord.Channel.VOICE
        and admission.scope == "owner"
        and admission.reason == VOICEPRINT_VERIFIED
    )
