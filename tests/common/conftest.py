"""The real GGUF files opened once per session (the Gemma file's header alone takes seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.common.gguf.reader import GGUFFile, open_gguf

REAL_MODELS = ("smollm2", "gemma3")


@dataclass
class RealGGUFs:
    """Lazily opened real files: `path(name)` (fetched), `file(name)` (a GGUFFile)."""

    request: pytest.FixtureRequest
    _files: dict[str, GGUFFile] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        return self.request.getfixturevalue(f"{name}_gguf")

    def file(self, name: str) -> GGUFFile:
        if name not in self._files:
            self._files[name] = open_gguf(self.path(name))
        return self._files[name]


@pytest.fixture(scope="session")
def real_ggufs(request: pytest.FixtureRequest) -> RealGGUFs:
    return RealGGUFs(request)
