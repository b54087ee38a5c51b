"""Tests of payments: intents and one-shot authorizations, and the races the authorities must win
exactly once."""
