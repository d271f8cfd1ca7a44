"""Pydantic / FastAPI validation failures -> one typed `ValidationError` (a 400, never a 422).

The message names the field the way API users write it (`messages[1].content`) and says what
was expected, without echoing the (possibly huge) input value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.common.errors import ValidationError


def field_path(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or "(" in part or part.startswith("function-")):
            continue  # pydantic's union-branch labels (e.g. "list[int]") are not fields
        else:
            path += f".{part}" if path else str(part)
    return path


def validation_error(errors: Sequence[dict[str, Any]]) -> ValidationError:
    if not errors:
        return ValidationError("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return ValidationError(f"request body is not valid JSON{': ' + detail if detail else ''}")
    param = field_path(first.get("loc", ()))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        message = "field required"
    text = f"{param}: {message}" if param else message
    others = len({field_path(e.get("loc", ())) for e in errors[1:]} - {param})
    if others:
        text += f" (and {others} more invalid field{'s' if others > 1 else ''})"
    return ValidationError(text, param=param)
