from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: accounts.devices imports models, which exist only once the app
        # registry is ready.
        from accounts.devices import owner_devices_preferring
        from yimi_project import push

        push.register_device_chooser(owner_devices_preferring)  # where cards go (yimi_project.push.owner_devices)
