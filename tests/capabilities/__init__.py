"""Tests of capabilities: manifests and the loader, the gateway and its receipts, truth, pack hosts and
their sandbox, the pack registry."""
