"""Tests of the companion: persona, call snapshot, topic state, the acceptance scenarios."""
