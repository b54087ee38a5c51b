from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these modules import models, which exist only once the app
        # registry is ready (memory is a layer below; no cycle is being dodged).
        from devices import push_to_talk
        from memory.archive import cold_store as archive

        archive.register_busy_check(push_to_talk.busy)  # no cold pack starts while push-to-talk is held, in any process
