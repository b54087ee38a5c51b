"""Tests of schedules: scheduled runs, watches, parcels."""
