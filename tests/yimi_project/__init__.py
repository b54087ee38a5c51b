"""Tests of yimi_project: settings, ASGI and HTTP guards, the database pool and statements, channel
layers and push, health, logs, files, the docs and the tests' own layout."""
