"""Domain enums <-> proto enums, matched by name: the domain member `NAME` is the proto value
`PREFIX_NAME` (`ToolChoiceMode.AUTO` <-> `TOOL_CHOICE_MODE_AUTO`). A member without its proto
twin fails at import; the conversion tests read every member back."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True, slots=True)
class EnumMapping(Generic[E]):
    to_pb: dict[E, Any]          # domain member -> proto value
    from_pb: dict[Any, E]        # proto value -> domain member (UNSPECIFIED has none)


def enum_mapping(domain: type[E], proto: EnumTypeWrapper, prefix: str) -> EnumMapping[E]:
    to_pb = {member: proto.Value(prefix + member.name) for member in domain}
    return EnumMapping(to_pb, {value: member for member, value in to_pb.items()})
