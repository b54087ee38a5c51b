"""The memory app's models, for Django: each is defined in its subpackage (``timeline``,
``assertions``, ``archive``, ``personal``) and imported here, so app_label ``memory`` and
every table stay as they were. Memory's own modules import a model from its subpackage's
``models``; other apps import it from here."""

from memory.archive.models import ColdAlert, ColdPack, ObjectLocation, RawObject
from memory.assertions.models import Assertion, AssertionDependency, AssertionVersion, MemoryReceipt, MemorySession
from memory.personal.models import AmbientRecord, HealthRecord, ImageRecord, LocationReport, Place
from memory.timeline.models import HistoryLookup, TimelineCounter, TimelineEmbedding, TimelineEntry

__all__ = [
    "AmbientRecord", "Assertion", "AssertionDependency", "AssertionVersion", "ColdAlert", "ColdPack", "HealthRecord",
    "HistoryLookup", "ImageRecord", "LocationReport", "MemoryReceipt", "MemorySession", "ObjectLocation", "Place",
    "RawObject", "TimelineCounter", "TimelineEmbedding", "TimelineEntry",
]
