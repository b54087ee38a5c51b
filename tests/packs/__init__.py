"""Tests of the shipped packs in packs/ themselves: manifests, contracts against the real servers and the
fakes, and the local services they talk to."""
