from django.apps import AppConfig

from capabilities import authorities


class ReleasesConfig(AppConfig):
    name = "releases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from releases.authority import ReleaseGate

        authorities.register_gate("releases", ReleaseGate())  # the gateway asks it about self_change calls
