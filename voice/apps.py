from django.apps import AppConfig


class VoiceConfig(AppConfig):
    name = "voice"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: voice.faces imports accounts' models, which exist only once
        # the app registry is ready (memory is a layer below; no cycle is being dodged).
        from memory.personal.images import register_image_analyzer
        from voice import faces

        register_image_analyzer(faces.image_analyzer)  # enrolled people in attached images: facts for the vision turn
