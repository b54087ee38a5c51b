"""The console page for faces: ``/admin/accounts/faceenrollment/`` (owner only).

The owner enrolls a person from photos (each with exactly one face), sees who is enrolled
under which face model — and who must be enrolled again because the face model in use
changed —, raises a person's threshold (never lowers it) and forgets a person. The
photos are read once and not kept. Everything is written by the services:
``voice.faces.enroll_from_photos`` and ``accounts.faces``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from accounts import faces as enrolled
from accounts.models import FaceEnrollment
from accounts.owner_admin import OwnerContentAdmin
from llm import catalog
from voice import faces
from yimi_project.errors import YimiError

PHOTO_MAX_BYTES = faces.IMAGE_MAX_BYTES


@admin.register(FaceEnrollment)
class FaceEnrollmentAdmin(OwnerContentAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # forgetting goes through the page's own form (accounts.faces.forget_person)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        error = ""
        status = 200
        if request.method == "POST":
            try:
                return self._post(request)
            except YimiError as exc:
                error, status = exc.message, 400
        return self._page(request, error=error, status=status)

    def _page(self, request: HttpRequest, *, error: str = "", status: int = 200) -> HttpResponse:
        owner_id = _owner_id(request)
        try:
            current: str | None = faces.current_face_entry().key
        except YimiError as exc:
            current, error = None, error or exc.message
        people = []
        for row in FaceEnrollment.objects.filter(owner_id=owner_id).order_by("name", "model_key"):
            people.append(
                {
                    "id": row.id, "name": row.name, "model_key": row.model_key, "photos": row.photo_count,
                    "updated_at": row.updated_at, "threshold": enrolled.threshold(owner_id, row.name, row.model_key),
                    "current": row.model_key == current,
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Faces",
            "opts": self.model._meta,
            "current_model": current,
            "face_models": catalog.load_catalog().of_kind("face"),
            "people": people,
            "reenroll": enrolled.reenrollment_needed(owner_id, current) if current else [],
            "error": error,
            "floor": enrolled.THRESHOLD_FLOOR,
            "ceiling": enrolled.THRESHOLD_CEILING,
            "uncertain_from": enrolled.UNCERTAIN_FROM,
            "photos_max": enrolled.PHOTOS_MAX,
        }
        return TemplateResponse(request, "admin/voice/faces.html", context, status=status)

    def _post(self, request: HttpRequest) -> HttpResponse:
        owner_id = _owner_id(request)
        action = request.POST.get("action", "")
        if action == "enroll":
            photos = request.FILES.getlist("photos")
            if any(p.size is None or p.size > PHOTO_MAX_BYTES for p in photos):
                raise YimiError("image_too_large", f"a photo is at most {PHOTO_MAX_BYTES // (1024 * 1024)} MB")
            enrollment = faces.enroll_from_photos(owner_id, request.POST.get("name", ""), [p.read() for p in photos])
            messages.success(request, f"Enrolled {enrollment.name} from {enrollment.photo_count} photo(s) under {enrollment.model_key}.")
        elif action in ("raise", "forget"):
            row = FaceEnrollment.objects.filter(owner_id=owner_id, id=_int(request.POST.get("enrollment"))).first()
            if row is None:
                raise YimiError("not_found", "no such enrolled person")
            if action == "raise":
                try:
                    value = float(request.POST.get("threshold", ""))
                except ValueError:
                    raise YimiError("invalid_request", "a threshold is a number") from None
                enrolled.raise_threshold(owner_id, row.name, row.model_key, value)
                messages.success(request, f"{row.name}'s threshold is now {value:.3f}.")
            else:
                enrolled.forget_person(owner_id, row.id)
                messages.success(request, f"Forgot {row.name}'s face under {row.model_key} (the threshold stays; it never lowers).")
        else:
            raise YimiError("invalid_request", "unknown action")
        return HttpResponseRedirect(request.path)


def _owner_id(request: HttpRequest) -> int:
    pk = request.user.pk  # the owner: every URL of this admin is owner-only (OwnerContentAdmin)
    if pk is None:
        raise PermissionDenied("sign in as the owner")
    return int(pk)


def _int(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        return -1
