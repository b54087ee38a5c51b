"""Tests of memory: the timeline, assertions, projections, recall, forgetting and erasure, the raw store and
cold packs, and the owner's personal records (location, health) with their packs."""
