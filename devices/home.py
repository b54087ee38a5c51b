"""``/``: the owner's home. Signed out, the admin login; signed in as the owner, the brain
(the demo one or a real model, answering or not: ``llm.probe``, cached there, so a
page view does not probe each time), what Yimi is doing now (open runs, cards waiting for
an answer, devices), how many packs are on, and links to what the owner manages in the
console (timeline, memory, models, packs, devices). Any other account gets 403
(``accounts.services.is_owner``). It lives in devices/, the top layer, because it reads
every app below it; it only reads."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from accounts.models import Device
from accounts.services import is_owner
from brain.models import Run
from capabilities.manifest import load_packs
from consent.models import ConsentCard
from llm.probe import brain_status
from payments.models import PaymentAuthorization

RECENTLY_SEEN = timedelta(minutes=5)


def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("admin:login"))
    if not is_owner(request.user):
        raise PermissionDenied("this Yimi belongs to its owner")
    owner, now = request.user, timezone.now()
    devices = list(Device.objects.filter(owner=owner, revoked_at__isnull=True).order_by("-last_seen_at", "name"))
    packs = load_packs()
    context = {
        "brain": brain_status(),
        "packs_on": len(packs.packs),
        "packs_off": len(packs.disabled) + len(packs.refused),
        "runs": Run.objects.filter(owner=owner, state__in=[Run.State.QUEUED, Run.State.RUNNING])
        .select_related("inbound", "origin_device").order_by("-created_at")[:20],
        "consent_cards": ConsentCard.objects.filter(owner=owner, state=ConsentCard.State.PENDING).order_by("created_at"),
        "payment_cards": PaymentAuthorization.objects.filter(
            intent__owner=owner, state=PaymentAuthorization.State.PENDING
        ).select_related("intent").order_by("created_at"),
        "devices_recent": [d for d in devices if d.last_seen_at and now - d.last_seen_at <= RECENTLY_SEEN],
        "devices_other": [d for d in devices if not d.last_seen_at or now - d.last_seen_at > RECENTLY_SEEN],
        "recently_seen_minutes": int(RECENTLY_SEEN.total_seconds() // 60),
    }
    return render(request, "devices/home.html", context)
