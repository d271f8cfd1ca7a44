"""JSON text <-> values, the way the frontend contract writes and reads them.

The proto carries JSON values (tool parameters, template kwargs, documents) as text. Writers
use `json_text`: compact, UTF-8 kept, the caller's key order kept. Readers use `parse_json` /
`parse_json_object`: strict (no NaN or Infinity, which JSON does not have), key order kept, and
every failure a ValidationError naming the field at fault.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.errors import ValidationError


def json_text(value: Any) -> str:
    """Compact JSON text keeping the caller's key order (tool arguments, schemas, kwargs)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str, *, param: str) -> Any:
    """Strict JSON; a ValidationError naming `param` when `text` is not JSON."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ValidationError(f"{param} is not valid JSON: {exc}", param=param) from exc


def parse_json_object(text: str, *, param: str, what: str = "") -> dict[str, Any]:
    """Strict JSON that must be an object; `what` names it in the message (default `param`)."""
    value = parse_json(text, param=param)
    if not isinstance(value, dict):
        raise ValidationError(
            f"{what or param} must be a JSON object, got {type(value).__name__}: "
            f"{text[:80]!r}", param=param)
    return value
