"""The predicates L3 gives a meaning of its own: ``core_profile.entry`` (one section of
``USER.md`` or ``MEMORY.md``, its ``doc``) and ``speaking.preferences`` (how Yimi speaks).
Both are projected into L2 files, so the writer (``memory.assertions.store``) and the
projections (``memory.assertions.projections``) read them from here."""

CORE_PROFILE = "core_profile.entry"
SPEAKING_PREFERENCES = "speaking.preferences"
PROJECTED_PREDICATES = (CORE_PROFILE, SPEAKING_PREFERENCES)
CORE_DOCS = ("user", "memory")  # USER.md, MEMORY.md
