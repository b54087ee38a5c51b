"""Tests of voice and vision: the voice socket, ASR, TTS, the realtime front, ambient analysis, faces."""
