"""The protobuf edge of the API-neutral domain: one `*_to_pb` / `*_from_pb` pair per message.

The gateway's frontend client writes requests and reads events with these; the frontend's
servicer reads requests (validating them) and writes events. The only modules of
`services.common.api` that import generated stubs.
"""

from services.common.api.convert.chat import (
    chat_input_from_pb,
    chat_input_to_pb,
    message_from_pb,
    message_to_pb,
)
from services.common.api.convert.events import (
    event_from_pb,
    event_to_pb,
    finish_reason_from_pb,
    finish_reason_to_pb,
    usage_from_pb,
    usage_to_pb,
)
from services.common.api.convert.generate import (
    completion_input_from_pb,
    completion_input_to_pb,
    generate_request_from_pb,
    generate_request_to_pb,
    response_format_from_pb,
    response_format_to_pb,
    sampling_from_pb,
    sampling_to_pb,
)
from services.common.api.convert.model_card import model_card_from_pb, model_card_to_pb

__all__ = [
    "chat_input_from_pb",
    "chat_input_to_pb",
    "completion_input_from_pb",
    "completion_input_to_pb",
    "event_from_pb",
    "event_to_pb",
    "finish_reason_from_pb",
    "finish_reason_to_pb",
    "generate_request_from_pb",
    "generate_request_to_pb",
    "message_from_pb",
    "message_to_pb",
    "model_card_from_pb",
    "model_card_to_pb",
    "response_format_from_pb",
    "response_format_to_pb",
    "sampling_from_pb",
    "sampling_to_pb",
    "usage_from_pb",
    "usage_to_pb",
]
