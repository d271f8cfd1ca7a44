"""Typed requests and results of the imageprep service (protobuf-free; see convert.py)."""

from __future__ import annotations

from dataclasses import dataclass

from services.imageprep.expansion import ExpandedPrompt
from services.imageprep.prepared import ImageGeometry


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image as the caller sent it: a data URL, or raw bytes with their media type."""

    data_url: str = ""
    data: bytes = b""
    media_type: str = ""


@dataclass(frozen=True, slots=True)
class PromptInput:
    """The rendered prompt to expand: one `image_token_id` placeholder per image."""

    token_ids: tuple[int, ...]
    image_token_id: int
    vision_start_token_id: int | None = None
    message_token_ends: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PrepareRequest:
    request_id: str
    profile: str                          # "" = the configured model's profile
    images: tuple[ImageInput, ...]
    min_pixels: int | None = None         # None = the profile's value
    max_pixels: int | None = None
    prompt: PromptInput | None = None     # None = no expansion
    # the caller's model limits (its core manifest's image_limits), beside imageprep's own
    max_image_bytes: int | None = None
    max_image_pixels: int | None = None
    limits_source: str = ""


@dataclass(frozen=True, slots=True)
class ImageDescriptor:
    """What the engine and the prefix cache learn about an image (no pixels)."""

    identity: bytes                       # 32-byte semantic identity
    profile: str
    geometry: ImageGeometry
    pixel_bytes: int                      # size of pixel_values
    source_index: int                     # position in the request's image list
    token_offset: int = 0                 # first span token in the expanded prompt


@dataclass(frozen=True, slots=True)
class PrepareResult:
    images: tuple[ImageDescriptor, ...]
    expanded: ExpandedPrompt | None = None


@dataclass(frozen=True, slots=True)
class TensorChunk:
    """One piece of one prepared tensor, as FetchPixels streams it."""

    identity: bytes
    tensor: str                           # pixel_values, grid_thw, ...
    dtype: str                            # float32, bfloat16, int64, int32
    shape: tuple[int, ...]
    offset: int                           # byte offset of `data` within the tensor
    data: bytes | memoryview              # a view of the retained array (no copy)
    last: bool                            # last chunk of this tensor
