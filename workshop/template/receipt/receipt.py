"""The Python receipt helper: the platform's ``capabilities.packkit`` (standard library only),
which every pack host puts on the path. A tool returns ``receipt(status, ...)``:

    from capabilities.packkit import ToolRegistry, effect, receipt, value

    TOOLS = ToolRegistry()

    @TOOLS("Save a note in Yimi's workspace.", {"type": "object", "properties": {"text": {"type": "string"}}})
    def save(args):
        ...
        return receipt("succeeded", effects=[effect("note:1", "write", "verified")],
                       values=[value("length", 12, "character", "workspace")])

Status is one of the receipt schema's nine values; an effect is verified only when the tool
read it back; a number always carries its unit and its source. ``receipt/receipt.ts`` is the
same helper for a pack written in TypeScript.
"""

from capabilities.packkit import RECEIPT_SCHEMA, ToolRegistry, effect, receipt, value

__all__ = ["RECEIPT_SCHEMA", "ToolRegistry", "effect", "receipt", "value"]
