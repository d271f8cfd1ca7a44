"""Protobuf at the edge: helios.v1 imageprep messages <-> the service's typed objects.

`chunk_to_wire` serialises a PixelChunk by hand: the small fields through protobuf, the tensor
bytes appended after their field header. A PixelChunk message would copy its payload twice
(into the message, then into the serialised string); this copies it once, straight from the
retained array, and gives the same bytes as `chunk_to_pb(chunk).SerializeToString()`.
"""

from __future__ import annotations

from services.common.errors import ValidationError
from services.common.pb import common_pb2, imageprep_pb2
from services.imageprep.requests import (
    ImageDescriptor,
    ImageInput,
    PrepareRequest,
    PrepareResult,
    PromptInput,
    TensorChunk,
)


def _image_input(index: int, source: imageprep_pb2.ImageSource) -> ImageInput:
    kind = source.WhichOneof("source")
    if kind == "data_url":
        return ImageInput(data_url=source.data_url, media_type=source.media_type)
    if kind == "data":
        return ImageInput(data=source.data, media_type=source.media_type)
    raise ValidationError(f"images[{index}] has neither data_url nor data",
                          param=f"images[{index}]")


def prepare_request_from_pb(message: imageprep_pb2.PrepareRequest) -> PrepareRequest:
    prompt = None
    if message.prompt_token_ids:
        if not message.HasField("image_token_id"):
            raise ValidationError("prompt_token_ids need image_token_id (the placeholder id)",
                                  param="image_token_id")
        prompt = PromptInput(
            token_ids=tuple(message.prompt_token_ids),
            image_token_id=message.image_token_id,
            vision_start_token_id=(message.vision_start_token_id
                                   if message.HasField("vision_start_token_id") else None),
            message_token_ends=tuple(message.message_token_ends))
    elif message.message_token_ends:
        raise ValidationError("message_token_ends need prompt_token_ids",
                              param="message_token_ends")
    return PrepareRequest(
        request_id=message.request_id,
        profile=message.profile,
        images=tuple(_image_input(i, s) for i, s in enumerate(message.images)),
        min_pixels=message.min_pixels if message.HasField("min_pixels") else None,
        max_pixels=message.max_pixels if message.HasField("max_pixels") else None,
        prompt=prompt,
        max_image_bytes=(message.max_image_bytes if message.HasField("max_image_bytes")
                         else None),
        max_image_pixels=(message.max_image_pixels if message.HasField("max_image_pixels")
                          else None),
        limits_source=message.limits_source)


def descriptor_to_pb(descriptor: ImageDescriptor) -> common_pb2.ImageDescriptor:
    geometry = descriptor.geometry
    return common_pb2.ImageDescriptor(
        identity=descriptor.identity, profile=descriptor.profile,
        height=geometry.height, width=geometry.width,
        grid_t=geometry.grid_t, grid_h=geometry.grid_h, grid_w=geometry.grid_w,
        num_patches=geometry.num_patches, num_tokens=geometry.num_tokens,
        token_offset=descriptor.token_offset, pixel_bytes=descriptor.pixel_bytes,
        source_index=descriptor.source_index)


def prepare_result_to_pb(result: PrepareResult) -> imageprep_pb2.PrepareResponse:
    images = [descriptor_to_pb(d) for d in result.images]
    response = imageprep_pb2.PrepareResponse(images=images)
    response.multimodal.images.extend(images)
    expanded = result.expanded
    if expanded is not None:
        response.expanded_token_ids.extend(expanded.token_ids.tolist())
        response.message_token_ends.extend(expanded.message_token_ends)
        response.modality_ids = expanded.modality_ids.tobytes()
        response.multimodal.mrope_positions = expanded.mrope_positions.astype("<i4").tobytes()
        response.multimodal.rope_delta = expanded.rope_delta
    return response


def chunk_to_pb(chunk: TensorChunk) -> imageprep_pb2.PixelChunk:
    return imageprep_pb2.PixelChunk(identity=chunk.identity, tensor=chunk.tensor,
                                    dtype=chunk.dtype, shape=list(chunk.shape),
                                    offset=chunk.offset, data=bytes(chunk.data),
                                    last=chunk.last)


# PixelChunk's field numbers, as proto/helios/v1/imageprep.proto numbers them.
_DATA_TAG = bytes([6 << 3 | 2])             # field 6 (data), length-delimited
_LAST_TRUE = bytes([7 << 3 | 0, 1])         # field 7 (last), varint 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def chunk_to_wire(chunk: TensorChunk) -> bytes:
    """The serialised PixelChunk: fields in number order, defaults omitted, as protobuf
    writes them, so any protobuf parser reads it (and it equals SerializeToString's bytes)."""
    head = imageprep_pb2.PixelChunk(identity=chunk.identity, tensor=chunk.tensor,
                                    dtype=chunk.dtype, shape=list(chunk.shape),
                                    offset=chunk.offset).SerializeToString()
    size = len(chunk.data)
    parts: list[bytes | memoryview] = [head]
    if size:                                # proto3 leaves an empty bytes field out
        parts += [_DATA_TAG, _varint(size), chunk.data]
    if chunk.last:
        parts.append(_LAST_TRUE)
    return b"".join(parts)
