"""Remembered SHA-256 digests of model files, so that a restart does not hash a checkpoint again.

Every service opens the model at start-up (services/common/core.py: a model directory's
identity and a core's verification are SHA-256 over its files): on the Qwen3-8B shape that is
16 GB per opener, several times per `helios run`. A digest is remembered per absolute path
with the file's size, modification and status-change times, inode and device; it is reused
only while all five are unchanged. Replacing or rewriting a file changes its status-change
time, which only root can set back, so a changed file is always hashed again. A file changed
less than `SETTLE_S` before it was hashed is not remembered (file times are coarse: a rewrite
within the same tick would keep the stamp; git calls this the racy-timestamp problem).

The cache is one JSON file under `$HELIOS_CACHE_DIR` (`digests.json`), replaced atomically;
concurrent writers may lose each other's entries (the file is then hashed once more), never
corrupt it. It keeps the newest `MAX_ENTRIES` files. `HELIOS_DIGEST_CACHE=0` turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MAX_ENTRIES = 4096
SETTLE_S = 2.0
ENV = "HELIOS_DIGEST_CACHE"


def _cache_file() -> Path:
    root = Path(os.environ.get("HELIOS_CACHE_DIR", Path.home() / ".cache" / "helios"))
    return root / "digests.json"


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _load(cache: Path) -> dict[str, dict]:
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(cache: Path, entries: dict[str, dict]) -> None:
    if len(entries) > MAX_ENTRIES:
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=cache.parent, prefix=".digests-")
        with os.fdopen(handle, "w") as out:
            json.dump(entries, out)
        os.replace(name, cache)


def sha256_files(paths: list[Path], compute: Callable[[list[Path]], list[str]]
                 ) -> dict[Path, str]:
    """The SHA-256 of each of `paths`: remembered ones while the files are unchanged, the rest
    from `compute` (which hashes a list of files, in order)."""
    if os.environ.get(ENV, "1") in ("0", "false", "no", "off"):
        return dict(zip(paths, compute(paths), strict=True))
    cache = _cache_file()
    entries = _load(cache)
    stamps = {path: _stamp(path) for path in paths}
    found: dict[Path, str] = {}
    for path in paths:
        entry = entries.get(str(path.resolve()))
        if isinstance(entry, dict) and entry.get("stamp") == stamps[path] and \
                isinstance(entry.get("sha256"), str):
            found[path] = entry["sha256"]
    missing = [path for path in paths if path not in found]
    if missing:
        settled = time.time_ns() - int(SETTLE_S * 1e9)
        for path, digest in zip(missing, compute(missing), strict=True):
            found[path] = digest
            if max(stamps[path][1], stamps[path][2]) > settled:
                continue                           # changed just now: hash it next time too
            key = str(path.resolve())
            entries.pop(key, None)                 # newest last (the eviction order)
            entries[key] = {"stamp": stamps[path], "sha256": digest}
        _save(cache, entries)
    return {path: found[path] for path in paths}
