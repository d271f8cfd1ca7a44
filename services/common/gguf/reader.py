"""Opening a GGUF file: its metadata as plain Python values and its tensor table, checked.

`open_gguf(path)` reads the header with `gguf.GGUFReader` (the file is memory-mapped; no tensor
data is read) and fails with a ValidationError naming the file when it is not a GGUF, is
truncated (a tensor's data runs past the end) or its header does not parse. Everything else in
this package reads the file through the returned `GGUFFile`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from services.common.errors import ValidationError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the table, before any data is read."""

    name: str                  # GGUF name: token_embd.weight, blk.3.attn_q.weight ...
    type_name: str             # ggml type: F32, F16, BF16, Q4_K, Q8_0 ...
    shape: tuple[int, ...]     # numpy / Hugging Face order (outermost first): [out, in]
    num_elements: int
    num_bytes: int
    data_offset: int           # absolute byte offset of the data in the file


class GGUFFile:
    """An opened GGUF file: `architecture`, `value(key)`, `tensors`, and the raw reader for
    dequantization (`reader_tensor(name)`)."""

    def __init__(self, path: Path, reader: Any) -> None:
        self.path = path
        self._reader = reader

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {self.architecture!r}, {len(self.tensors)} tensors)"

    # -- metadata ------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python: str, int, float, bool, or a list of them."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise ValidationError(f"{self.path}: metadata key {key!r} does not parse: {exc}",
                                  param=key) from exc

    def array(self, key: str, dtype: type[np.generic]) -> np.ndarray | None:
        """A numeric array value as one numpy array (token scores and types)."""
        field = self._reader.fields.get(key)
        if field is None:
            return None
        if not field.data:
            return np.zeros(0, dtype=dtype)
        return np.concatenate([field.parts[i] for i in field.data]).astype(dtype)

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        """`{architecture}.{suffix}`: the per-architecture hyperparameters."""
        return self.value(f"{self.architecture}.{suffix}", default)

    @cached_property
    def architecture(self) -> str:
        arch = self.value("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ValidationError(f"{self.path}: no general.architecture in the metadata",
                                  param="general.architecture")
        return arch

    @property
    def keys(self) -> list[str]:
        return [key for key in self._reader.fields if not key.startswith("GGUF.")]

    # -- tensors -------------------------------------------------------------------------------

    @cached_property
    def tensors(self) -> tuple[TensorInfo, ...]:
        return tuple(
            TensorInfo(name=t.name, type_name=t.tensor_type.name,
                       shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                       num_elements=int(t.n_elements), num_bytes=int(t.n_bytes),
                       data_offset=int(t.data_offset))
            for t in self._reader.tensors)

    @cached_property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tensors)

    def reader_tensor(self, name: str) -> Any:
        """The gguf package's ReaderTensor (its `data` is a view into the mapped file)."""
        for tensor in self._reader.tensors:
            if tensor.name == name:
                return tensor
        raise ValidationError(f"{self.path}: no tensor {name!r}", param=name)

    def reader_tensors(self) -> list[Any]:
        return list(self._reader.tensors)


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc}", param=str(path)) from exc
    if head != GGUF_MAGIC:
        raise ValidationError(
            f"{path} is not a GGUF file (it starts with {head!r}, a GGUF file with b'GGUF')",
            param=str(path))


def _check_extent(path: Path, gguf_file: GGUFFile) -> None:
    size = path.stat().st_size
    for tensor in gguf_file.tensors:
        end = tensor.data_offset + tensor.num_bytes
        if end > size:
            raise ValidationError(
                f"{path} is truncated: tensor {tensor.name} ({tensor.type_name}) ends at byte "
                f"{end:,} but the file has {size:,} bytes", param=str(path))


def is_gguf_file(path: Path | str) -> bool:
    """True when `path` is a regular file starting with the GGUF magic."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path: Path | str) -> GGUFFile:
    """Open and check a GGUF file (header parsed, every tensor within the file)."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise ValidationError(f"{path} does not exist or is not a file", param=str(path))
    _check_magic(path)
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        # Cut short or corrupt: numpy cannot read (header) or reshape (tensor data) past the end.
        raise ValidationError(f"{path} ({path.stat().st_size:,} bytes) is truncated or "
                              f"malformed: {exc}", param=str(path)) from exc
    gguf_file = GGUFFile(path, reader)
    _check_extent(path, gguf_file)
    return gguf_file
