"""Tests of accounts: the owner, admission, voice identity, the owner-only admin and the owner's console."""
