"""Remembered file digests: reused while a file is unchanged, recomputed when it changes."""

from __future__ import annotations

import hashlib
import json

import pytest

from services.common import digest_cache
from services.common.core import ManifestError, open_model, prepare_core


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(directory))
    monkeypatch.delenv(digest_cache.ENV, raising=False)
    monkeypatch.setattr(digest_cache, "SETTLE_S", 0.0)   # the files here are seconds old
    return directory


def _counting(calls: list[list[str]]):
    def compute(paths):
        calls.append([p.name for p in paths])
        return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    return compute


def test_unchanged_files_are_not_hashed_again(tmp_path, cache_dir):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"alpha")
    b.write_bytes(b"beta")
    calls: list[list[str]] = []
    first = digest_cache.sha256_files([a, b], _counting(calls))
    assert first[a] == hashlib.sha256(b"alpha").hexdigest() and calls == [["a.bin", "b.bin"]]
    assert digest_cache.sha256_files([a, b], _counting(calls)) == first and len(calls) == 1
    b.write_bytes(b"BETA")                           # rewritten: hashed again, alone
    again = digest_cache.sha256_files([a, b], _counting(calls))
    assert calls[-1] == ["b.bin"] and again[b] == hashlib.sha256(b"BETA").hexdigest()
    b.unlink()
    b.write_bytes(b"beta")                           # replaced (new inode, ctime)
    digest_cache.sha256_files([b], _counting(calls))
    assert calls[-1] == ["b.bin"]


def test_a_file_changed_just_now_is_not_remembered(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(digest_cache, "SETTLE_S", 60.0)
    a = tmp_path / "a.bin"
    a.write_bytes(b"alpha")
    calls: list[list[str]] = []
    digest_cache.sha256_files([a], _counting(calls))
    digest_cache.sha256_files([a], _counting(calls))
    assert len(calls) == 2                  # a same-tick rewrite could keep its stamp


def test_a_corrupt_cache_file_is_ignored_and_the_switch_turns_it_off(tmp_path, cache_dir,
                                                                      monkeypatch):
    a = tmp_path / "a.bin"
    a.write_bytes(b"alpha")
    cache_dir.mkdir()
    (cache_dir / "digests.json").write_text("{not json")
    calls: list[list[str]] = []
    digest_cache.sha256_files([a], _counting(calls))
    assert json.loads((cache_dir / "digests.json").read_text())   # rewritten whole
    monkeypatch.setenv(digest_cache.ENV, "0")
    digest_cache.sha256_files([a], _counting(calls))
    assert len(calls) == 2


def test_a_restart_verifies_a_core_without_rehashing_and_still_sees_tampering(
        tmp_path, cache_dir, demo_model_dir, monkeypatch):
    core = tmp_path / "core"
    prepare_core(demo_model_dir, core)
    open_model(core)                                  # verifies (and remembers) every file
    hashed: list[str] = []
    original = digest_cache.sha256_files

    def spy(paths, compute):
        return original(paths, lambda missing: (hashed.extend(p.name for p in missing),
                                                compute(missing))[1])

    monkeypatch.setattr(digest_cache, "sha256_files", spy)
    monkeypatch.setattr("services.common.core.sha256_files", spy)
    open_model(core)
    assert hashed == []
    weights = next(p for p in core.iterdir() if p.suffix == ".safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.unlink()
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match its fingerprint"):
        open_model(core)
    assert hashed == [weights.name]
