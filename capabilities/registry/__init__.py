"""The pack registry (issue 18, flow F4): checks, publish, monitor, rollback.

Public entry points (other apps call only these):

- ``add_candidate(directory, *, origin, built_against)`` → ``PackCandidate``: static and
  honesty checks, stored by content digest (``candidates.py``). The workshop hands every
  build here.
- ``online_digest(name)``: the digest of the version online now (what a build is
  ``built_against``), None when no published version is online.
- ``publish(digest)``, ``revert(name)``, ``set_enabled(name, enabled)``
  (``publish.py``); ``monitor_cycle()`` (``monitor.py``, Celery beat).
- ``grants``: which secrets each pack was granted (``grant``, ``revoke``,
  ``grant_shipped_secrets``, ``not_granted``; ``grants.py``).
"""

from __future__ import annotations

from capabilities.registry.candidates import add_candidate
from capabilities.registry.publish import online_digest, publish, revert, set_enabled

__all__ = ["add_candidate", "online_digest", "publish", "revert", "set_enabled"]
