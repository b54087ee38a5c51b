"""Tests of the model side: the model client, roles, drafts, usage, the local catalog and the demo brain."""
