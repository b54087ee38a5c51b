"""Tests of the workshop: find, build, self-test in the sandbox, publish, its pack."""
