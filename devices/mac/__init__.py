"""The owner's Mac through its paired device (docs/protocol.md, "The Mac relay").

``relay`` carries operations to the Mac and results back, sealed with ``crypto``; ``models``
is the command log (``MacKey``, ``MacPause``, ``MacOperation``), ``admin`` its console page;
``internal`` and ``urls`` are the owner-mac and desktop packs' ``/internal/mac/`` endpoint.
``sim`` is the simulated Mac, running operations in ``sandbox`` on the simulated ``desktop``.

No imports here: the pack sandbox mounts this file, ``sandbox.py`` and ``desktop.py`` for
the packs' fakes (``capabilities.mcp_host.sandbox.SHARED_MODULES``), without Django.
"""
