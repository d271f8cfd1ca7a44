"""Environment switches that a module reads once (a `functools.cache` reader), set for a test.

    with env_switch(monkeypatch, "HELIOS_PDL", pdl.switched_off) as set_switch:
        set_switch("0")          # sets the variable and clears the reader's cache
        ...

On leaving, the variable is removed and the reader's cache cleared again, so the next test
reads the real environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def env_switch(monkeypatch: pytest.MonkeyPatch, name: str,
               reader: Any) -> Iterator[Callable[[str], None]]:
    def set_switch(value: str) -> None:
        monkeypatch.setenv(name, value)
        reader.cache_clear()

    try:
        yield set_switch
    finally:
        monkeypatch.delenv(name, raising=False)
        reader.cache_clear()
