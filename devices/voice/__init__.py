"""Voice sessions on the server: audio in, utterances out (docs/voice.md).

``audio`` checks PCM frames and measures quality, ``engines`` wraps the sherpa-onnx models
named by the local catalog, ``session`` segments one socket's stream into utterances,
``services`` records what each utterance became, ``speech`` is the speech-synthesis seam.
"""
