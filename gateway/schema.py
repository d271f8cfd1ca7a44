"""Building blocks shared by every protocol's pydantic request models.

Numbers are bounded to what the proto fields hold (uint32 / int32), floats must be finite
(Python's json accepts NaN and Infinity), and unknown fields are ignored, so every malformed
body fails validation with a 400 naming the field instead of failing later as a 500.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from services.common.errors import ValidationError

UINT32_MAX = 2**32 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

UInt32 = Annotated[int, Field(ge=0, le=UINT32_MAX)]
PositiveUInt32 = Annotated[int, Field(ge=1, le=UINT32_MAX)]
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
TokenId = Annotated[int, Field(ge=0, le=UINT32_MAX)]

# Names and ids a request carries are bounded: they appear in error messages (which travel in
# gRPC trailers, limited to 16 KiB per header) and in logs; a 1 MB model name was a 500.
MAX_NAME_CHARS = 256
MAX_ID_CHARS = 256
MAX_USER_CHARS = 512
ModelName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
RequiredModelName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
Identifier = Annotated[str, Field(max_length=MAX_ID_CHARS)]
UserString = Annotated[str, Field(max_length=MAX_USER_CHARS)]


def check_path_value(value: str, *, param: str, limit: int = MAX_ID_CHARS) -> str:
    """A path parameter (response id, model name) within `limit` characters, else a 400."""
    if len(value) > limit:
        raise ValidationError(f"{param}: at most {limit} characters are allowed, got "
                              f"{len(value)}", param=param)
    return value


class ApiModel(BaseModel):
    """Base of request models: unknown fields ignored, floats finite."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


def json_object_text(text: str, *, param: str) -> str:
    """Check that `text` is a JSON object (tool-call arguments) and return it unchanged."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ValidationError(f"{param} must be a JSON object: {exc}", param=param) from exc
    if not isinstance(value, dict):
        raise ValidationError(f"{param} must be a JSON object, not {type(value).__name__}",
                              param=param)
    return text if text.strip() else "{}"
