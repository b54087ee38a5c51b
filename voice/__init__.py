"""The voice app: speech and faces on the server (docs/voice.md, docs/faces.md).

Audio in, utterances out: ``audio`` checks PCM frames and measures quality, ``engines``
wraps the sherpa-onnx models named by the local catalog (``probe`` builds and runs them once
in a child process), ``session`` segments one socket's stream into utterances, ``asr`` is
server transcription, ``ambient`` the bounded analysis of ambient speech, ``services``
records what each utterance became (``VoiceUtterance``), ``tts`` speaks replies,
``realtime`` is the realtime front, ``speech`` the speech-synthesis seam. ``faces`` finds
and recognizes faces in images (``face_admin`` is its console page). The sockets that carry
all of it are devices' (``devices.consumers``); nothing here imports devices/.
"""
