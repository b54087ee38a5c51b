"""Fake location: the real server's tools and receipts, against an in-memory platform.

It loads ``server/tools.py`` and replaces its ``call`` with ``FakePlatform.call``, which
applies the platform's rules (``memory.personal.location``, ``schedules.geofences``): names of 1-64
characters, coordinates in range, radius 20 m-50 km (default 150), haversine on the mean
Earth radius rounded to the metre, a place that does not exist is ``not_found``, a geofence
on a named place (once unless ``repeat``). One report (the owner at 家, ±10 m at
2026-01-01T08:00:00+00:00) and one place, 家 (Beijing, 39.9087, 116.3975, 150 m).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import uuid
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_location_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
EARTH_RADIUS_M = 6_371_008.8
NAMESPACE = uuid.UUID("6c0f3d52-1b7e-4c8a-a1f4-2f5e9b0d7c31")
UPDATED = "2026-01-01T00:00:00+00:00"


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


class FakePlatform:
    def __init__(self) -> None:
        self.report = {"id": "00000000-0000-4000-8000-00000000000a", "lat": 39.9087, "lon": 116.3975, "accuracy_m": 10.0,
                       "at": "2026-01-01T08:00:00+00:00", "device": "fake phone"}
        self.places: dict[str, dict[str, Any]] = {"家": {"name": "家", "lat": 39.9087, "lon": 116.3975, "radius_m": 150.0, "updated_at": UPDATED}}
        self.fences: dict[str, dict[str, Any]] = {}

    def call(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            handler = {"where/": self.where, "places/": self.place_action, "distance/": self.distance, "geofences/": self.geofence_action}.get(path)
            if handler is None:
                raise Refused(404, "not_found", "no such endpoint")
            return 200, handler(body)
        except Refused as exc:
            return exc.status, {"error": {"code": exc.code, "message": exc.message}}

    @staticmethod
    def name(value: Any) -> str:
        name = " ".join(value.split()) if isinstance(value, str) else ""
        if not 1 <= len(name) <= 64:
            raise Refused(400, "invalid_request", "a place's name is 1 to 64 characters")
        return name

    @staticmethod
    def number(value: Any, label: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise Refused(400, "invalid_request", f"{label} must be a number from {low:g} to {high:g}")
        return float(value)

    def place(self, name: Any) -> dict[str, Any]:
        found = self.places.get(self.name(name))
        if found is None:
            raise Refused(404, "not_found", f"there is no place named {self.name(name)!r}")
        return found

    def state(self, place: dict[str, Any]) -> str | None:
        if self.report["accuracy_m"] > place["radius_m"]:
            return None
        inside = haversine_m(self.report["lat"], self.report["lon"], place["lat"], place["lon"]) <= place["radius_m"]
        return "inside" if inside else "outside"

    def where(self, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = {"report": dict(self.report), "inside": [n for n, p in sorted(self.places.items()) if self.state(p) == "inside"]}
        if body.get("place") is not None:
            place = self.place(body["place"])
            answer["place"] = {"name": place["name"], "state": self.state(place),
                               "distance_m": round(haversine_m(self.report["lat"], self.report["lon"], place["lat"], place["lon"]))}
        return answer

    def place_action(self, body: dict[str, Any]) -> dict[str, Any]:
        action = body.get("action", "list")
        if action == "list":
            return {"places": [dict(p) for _, p in sorted(self.places.items())]}
        if action == "remove":
            place = self.place(body.get("name"))
            del self.places[place["name"]]
            return {"removed": place["name"]}
        if action != "set":
            raise Refused(400, "invalid_request", "action is list, set or remove")
        name = self.name(body.get("name"))
        if body.get("here") is True:
            lat, lon = self.report["lat"], self.report["lon"]
        else:
            lat, lon = self.number(body.get("lat"), "lat", -90, 90), self.number(body.get("lon"), "lon", -180, 180)
        radius = 150.0 if body.get("radius_m") is None else self.number(body["radius_m"], "radius_m", 20, 50_000)
        created = name not in self.places
        self.places[name] = {"name": name, "lat": round(lat, 7), "lon": round(lon, 7), "radius_m": radius, "updated_at": UPDATED}
        return {"place": dict(self.places[name]), "created": created}

    def point(self, spec: Any) -> tuple[float, float, str]:
        if spec == "here":
            return self.report["lat"], self.report["lon"], "here"
        if isinstance(spec, dict) and "place" in spec:
            place = self.place(spec["place"])
            return place["lat"], place["lon"], place["name"]
        if isinstance(spec, dict) and "lat" in spec and "lon" in spec:
            lat, lon = self.number(spec["lat"], "lat", -90, 90), self.number(spec["lon"], "lon", -180, 180)
            return lat, lon, f"{lat:.5f},{lon:.5f}"
        raise Refused(400, "invalid_request", 'a point is {"place": name}, {"lat": .., "lon": ..} or "here"')

    def distance(self, body: dict[str, Any]) -> dict[str, Any]:
        lat1, lon1, a = self.point(body.get("from"))
        lat2, lon2, b = self.point(body.get("to"))
        return {"from": a, "to": b, "distance_m": round(haversine_m(lat1, lon1, lat2, lon2))}

    def geofence_action(self, body: dict[str, Any]) -> dict[str, Any]:
        action = body.get("action", "list")
        if action == "list":
            return {"geofences": [dict(f) for f in self.fences.values() if f["active"]]}
        if action == "create":
            place = self.place(body.get("place"))
            repeat = body.get("repeat", False)
            if not isinstance(repeat, bool):
                raise Refused(400, "invalid_request", "repeat is true or false")
            watch_id = str(uuid.uuid5(NAMESPACE, f"{place['name']}:{len(self.fences)}"))
            self.fences[watch_id] = {"watch_id": watch_id, "place": place["name"], "repeat": repeat, "active": True,
                                     "last_state": self.state(place), "created_at": UPDATED}
            return {"geofence": dict(self.fences[watch_id])}
        if action == "cancel":
            fence = self.fences.get(str(body.get("watch_id")))
            if fence is None:
                raise Refused(404, "not_found", "no geofence with this watch_id")
            was_active, fence["active"] = fence["active"], False
            return {"cancelled": was_active, "watch_id": fence["watch_id"]}
        raise Refused(400, "invalid_request", "action is create, list or cancel")


PLATFORM = FakePlatform()
server.call = PLATFORM.call
