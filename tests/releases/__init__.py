"""Tests of releases: build, gate, idle, switch, watchdog, rollback, baseline, the release pack."""
