from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "devices"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from brain import model_settings
        from devices.switch_signers import DeviceSwitchSigners

        model_settings.register_switch_signers(DeviceSwitchSigners())  # who may sign a local-model switch
