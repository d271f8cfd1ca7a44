"""GatewayConfig: one frozen dataclass for the HTTP gateway."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import CommonConfig, option
from services.common.errors import ValidationError


@dataclass(frozen=True)
class GatewayConfig(CommonConfig):
    host: str = option("127.0.0.1", "HTTP bind address")
    port: int = option(8000, "HTTP port")
    frontend_address: str = option("127.0.0.1:50051", "frontend gRPC address")
    api_key: str = option("", "require this bearer token / x-api-key ('' = open)")
    redis_url: str = option("", "stored responses in Redis ('' = in memory)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.port <= 65535:
            raise ValidationError("port must be within 0..65535", param="port")
        if not self.frontend_address:
            raise ValidationError("gateway needs --frontend-address", param="frontend_address")
