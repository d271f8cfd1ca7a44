"""Fixtures for the imageprep tests: the committed parity images and their fingerprints."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FIXTURE_DIR = HERE / "fixtures"
FINGERPRINTS = HERE / "fingerprints.json"


@cache
def fingerprints() -> dict[str, Any]:
    return json.loads(FINGERPRINTS.read_text())


def fixture_bytes(name: str) -> bytes:
    return (FIXTURE_DIR / name).read_bytes()


MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".webp": "image/webp"}


def media_type_of(name: str) -> str:
    return MEDIA_TYPES[Path(name).suffix]


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    return fingerprints()
