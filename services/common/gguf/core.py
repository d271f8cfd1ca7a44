"""Prepared cores from a GGUF file.

    prepare_gguf_core(Path("model.gguf"), Path("/cores/m"))   # -> Manifest
    gguf_core(Path("model.gguf"))                              # -> the cached core's directory

A GGUF core is an ordinary prepared core (services.common.core): the .gguf itself (role
`weights`, hard-linked, else copied) beside the config.json, tokenizer.json,
tokenizer_config.json (with the file's chat template) and generation_config.json (the stop ids)
generated from its metadata, and the manifest fingerprinting all of them. Everything that can
be wrong with the file (not a GGUF, truncated, another architecture, a tensor type the gguf
package cannot dequantize, an unknown tensor or tokenizer) is found here, at prepare time.

`gguf_core` is how `helios run model.gguf` and `open_model("model.gguf")` serve a file
directly: the core is prepared once under `cache_root()/gguf-cores/`, in a directory named by
the file's identity (resolved path, size, modification time), and reused after that; the
manifest holds the file's SHA-256, so a core whose file changed is refused when opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from services.common.assets import cache_root
from services.common.core import MANIFEST_NAME, Manifest, inspect_model_dir
from services.common.errors import ValidationError
from services.common.gguf.config import hf_config
from services.common.gguf.reader import open_gguf
from services.common.gguf.tensors import check_tensors, count_parameters
from services.common.gguf.tokenizer import hf_tokenizer

log = logging.getLogger(__name__)

CACHE_DIR_NAME = "gguf-cores"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_gguf_model_dir(gguf_path: Path, out: Path) -> int:
    """Write the model directory of a GGUF file into the empty directory `out`; returns the
    parameter count (read from the tensor table)."""
    gguf_file = open_gguf(gguf_path)
    check_tensors(gguf_file)
    config = hf_config(gguf_file)
    tokenizer = hf_tokenizer(gguf_file)
    generation: dict[str, Any] = {"eos_token_id": list(tokenizer.stop_token_ids)}
    for key in ("bos_token_id", "pad_token_id"):
        if key in config:
            generation[key] = config[key]
    (out / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
    _write_json(out / "config.json", config)
    _write_json(out / "tokenizer_config.json", tokenizer.tokenizer_config)
    _write_json(out / "generation_config.json", generation)
    _link_or_copy(gguf_path, out / gguf_path.name)
    return count_parameters(gguf_file)


def prepare_gguf_core(gguf_path: Path, out: Path, *, model_id: str | None = None,
                      **options: Any) -> Manifest:
    """Write a core for a GGUF file into `out` (which must be empty or absent)."""
    gguf_path, out = Path(gguf_path), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValidationError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    try:
        num_parameters = write_gguf_model_dir(gguf_path, out)
        manifest = inspect_model_dir(out, model_id=model_id or gguf_path.stem,
                                     num_parameters=num_parameters, **options)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def file_identity(path: Path) -> str:
    """16 hex chars naming a file by its resolved path, size and modification time."""
    resolved = path.resolve()
    stat = resolved.stat()
    key = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return hashlib.sha256(key).hexdigest()[:16]


def gguf_core(gguf_path: Path | str) -> Path:
    """The cached core of a GGUF file, prepared on first use (concurrent callers: one wins,
    the others find its core)."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ValidationError(f"{gguf_path} does not exist or is not a file",
                              param=str(gguf_path))
    parent = cache_root() / CACHE_DIR_NAME
    target = parent / f"{gguf_path.stem}-{file_identity(gguf_path)}"
    if (target / MANIFEST_NAME).is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    log.info("preparing a core for %s in %s (once)", gguf_path, target)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".prepare-") as tmp:
        staged = Path(tmp) / "core"
        prepare_gguf_core(gguf_path.resolve(), staged)
        try:
            staged.rename(target)
        except OSError:
            if not (target / MANIFEST_NAME).is_file():   # not a concurrent winner: a failure
                raise
    return target
