from django.apps import AppConfig

from yimi_project import push


class DevicesConfig(AppConfig):
    name = "devices"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these modules import models, which exist only once the app
        # registry is ready (brain.model_settings is a layer below; no cycle is being dodged).
        from devices import push_to_talk
        from devices.services import owner_devices_preferring
        from devices.switch_signers import DeviceSwitchSigners
        from llm import model_settings
        from memory.archive import cold_store as archive

        model_settings.register_switch_signers(DeviceSwitchSigners())  # who may sign a local-model switch
        push.register_device_chooser(owner_devices_preferring)  # where cards go (yimi_project.push.owner_devices)
        archive.register_busy_check(push_to_talk.busy)  # no cold pack starts while push-to-talk is held, in any process
