from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path

from yimi_project.views import health, health_live, moved_admin_page

# Admin pages whose models moved to another app (the restructure of issue 36): the old
# address answers a permanent redirect, so bookmarks and links in old notes still work.
MOVED_ADMIN_PAGES = {
    ("devices", "accounts"): ("device", "pairingcode"),
    ("devices", "voice"): ("voiceutterance",),
    ("brain", "llm"): ("modelselection", "modelrole", "modelroledraft", "modelusage"),
    ("brain", "companion"): ("personaversion", "contentcard", "callsnapshot", "privacyepoch", "companionsettings"),
    ("brain", "schedules"): ("reminder", "schedule", "watch", "watchnotice"),
}

urlpatterns = [
    *(
        re_path(rf"^admin/{old}/(?P<rest>(?:{'|'.join(models)})/.*)$", moved_admin_page, {"app": new})
        for (old, new), models in MOVED_ADMIN_PAGES.items()
    ),
    path("admin/", admin.site.urls),
    path("api/health/", health),  # readiness: the database, Redis and the brain
    path("api/health/live/", health_live),  # liveness: this process and its database
    path("api/", include("accounts.schema_urls")),  # /api/schema/ and /api/docs/ (owner only)
    path("api/", include("devices.urls")),
    path("api/", include("memory.urls")),
    path("internal/gateway/", include("capabilities.urls")),
    path("internal/memory/", include("memory.internal_urls")),
    path("internal/mac/", include("devices.mac.urls")),  # the owner-mac pack (devices/mac/internal.py)
    path("internal/erasure/", include("memory.timeline.erasure_urls")),  # the erasure pack (memory/timeline/erasure_views.py)
    path("internal/profile/", include("memory.assertions.profile_urls")),  # the personal pack (memory/assertions/profile_views.py)
    path("internal/health/", include("memory.personal.health_urls")),  # the health pack (memory/personal/health_views.py)
    path("internal/workshop/", include("workshop.internal_urls")),  # the workshop pack (workshop/internal_views.py)
    path("internal/releases/", include("releases.internal_urls")),  # the release pack (releases/internal_views.py)
    path("internal/", include("schedules.urls")),  # the schedule, location and delivery packs (schedules/views.py)
    path("internal/", include("brain.internal_urls")),
    path("", include("devices.home_urls")),  # the owner's home
]
