"""Pydantic / FastAPI validation failures -> one typed `ValidationError` (a 400, never a 422).

The message names the field the way API users write it (`messages[1].content`) and says what
was expected, without echoing the (possibly huge) input value.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from services.common.errors import ValidationError

_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def field_path(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and (part in _TYPE_LABELS or "[" in part or "(" in part
                                        or part.startswith("function-")):
            continue  # pydantic's union-branch labels (e.g. "str", "list[int]") are not fields
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


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _lone_surrogate_path(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if any("\ud800" <= ch <= "\udfff" for ch in value) else None
    items: Any = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _lone_surrogate_path(key, path) is not None:
            return path or "body"
        where = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        found = _lone_surrogate_path(item, where)
        if found is not None:
            return found
    return None


def check_unicode(body: bytes) -> ValidationError | None:
    """A body must be UTF-8 (RFC 8259; Python's json would otherwise let encoded surrogates
    through), and JSON may spell unpaired UTF-16 surrogates (`"\\ud800"`), which are not
    Unicode text and cannot cross gRPC: refuse both with a 400 naming the field. Paired
    escapes (emoji) pass."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ValidationError(f"request body is not valid UTF-8 (byte {exc.start})")
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None   # not JSON at all: the route's own parser reports that
    path = _lone_surrogate_path(value, "")
    if path is None:
        return None
    return ValidationError(f"{path or 'body'}: text contains an unpaired UTF-16 surrogate "
                           "(invalid Unicode)", param=path)


class _NonFinite:
    """Stands in for a NaN / Infinity literal (or an overflowing number) while locating it."""

    def __init__(self, text: str) -> None:
        self.text = text


def _non_finite_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite_path(value: Any, path: str) -> tuple[str, str] | None:
    if isinstance(value, _NonFinite):
        return path, value.text
    items: Any = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        found = _non_finite_path(item, where)
        if found is not None:
            return found
    return None


# Bytes that can spell a non-finite number: the literals Python's json accepts (NaN, Infinity,
# -Infinity) and exponents large enough to overflow a double (1e999).
_MAYBE_NON_FINITE = re.compile(rb"NaN|Infinity|[0-9][eE][+]?[0-9]{3}")


QUOTE_WALK_LIMIT = 4096     # _outside_strings walks at most this many quotes


def _outside_strings(body: bytes) -> list[bytes] | None:
    """The pieces of a JSON body outside its strings, where numbers and literals are. A base64
    image in a string spells NaN, Infinity and 1e234-like runs by chance (~50 times in a 2 MB
    data URL), and scanning all of it cost 18-32 ms (Python's regex over 2 MB); finding the
    quotes (memchr) skips the strings' bytes. A quote after an odd run of backslashes inside
    a string is escaped. An unterminated string is left to the route's parser. None past
    QUOTE_WALK_LIMIT quotes."""
    pieces: list[bytes] = []
    start, inside = 0, False    # where this outside piece, or this string's content, starts
    quote = body.find(b'"')
    walked = 0
    while quote != -1:
        walked += 1
        if walked > QUOTE_WALK_LIMIT:
            return None
        if not inside:
            pieces.append(body[start:quote])
            inside, start = True, quote + 1
        else:
            run = quote
            while run > start and body[run - 1] == 0x5C:         # the backslashes before it
                run -= 1
            if (quote - run) % 2 == 0:                            # not escaped: the string ends
                inside, start = False, quote + 1
        quote = body.find(b'"', quote + 1)
    if not inside:
        pieces.append(body[start:])
    return pieces


def check_finite(body: bytes) -> ValidationError | None:
    """`NaN`, `Infinity` and `-Infinity` are not JSON (RFC 8259), but Python's json (and so
    FastAPI's body parsing) accepts them, and numbers such as 1e999 parse as infinity: refuse
    both anywhere in the body with a 400 naming the field, so no route (typed float fields or
    free-form ones such as Ollama `options`) ever sees a non-finite number."""
    # Many quotes (an array of a million short strings): one regex scan of the whole body is
    # cheaper than walking them all (24 against 250 ms for 2.5 MB)
    pieces = _outside_strings(body)
    if not any(_MAYBE_NON_FINITE.search(piece) for piece in
               (pieces if pieces is not None else [body])):
        return None
    try:
        value = json.loads(body, parse_constant=_NonFinite, parse_float=_non_finite_float,
                           parse_int=int)
    except (ValueError, RecursionError):
        return None   # not JSON at all: the route's own parser reports that
    found = _non_finite_path(value, "")
    if found is None:
        return None
    path, text = found
    return ValidationError(f"{path or 'body'}: {text[:40]} is not a finite number (NaN and "
                           "Infinity are not JSON)", param=path)


def check_body(body: bytes) -> ValidationError | None:
    """Every body check the ingress runs before a route parses the JSON: Unicode, then finite
    numbers."""
    return check_unicode(body) or check_finite(body)
