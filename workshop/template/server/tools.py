"""The pack's tools (the workshop replaces this file with the build spec's adapter).

Each tool is declared with ``@TOOLS(description, input_schema)`` under the name the
manifest gives it, and returns a receipt (``receipt(...)``, see ``receipt/receipt.py``).
"""

from __future__ import annotations

from capabilities.packkit import ToolRegistry

TOOLS = ToolRegistry()
