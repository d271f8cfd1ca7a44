"""The image processor: upright RGB pixels + settings -> a PreparedImage.

    decoded RGB8 --smart_resize/resize_rgb--> resized RGB8 (kept: PixelPatches)
        --patch order, normalize, temporal copies--> pixel_values [N, C*T*P*P]
        (computed on demand: by chunks for FetchPixels, or by the engine from the raw pixels;
        services/common/pixel_patches.py)
    grid --vision_positions--> [N, 2] --table_interpolation--> indices/weights [N, 4]

Every step is a pure function of its inputs (see resize.py, patches.py, positions.py); this
module only sequences them and names the outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from services.imageprep.decode import DecodedImage
from services.imageprep.identity import semantic_identity
from services.imageprep.patches import PixelPatches
from services.imageprep.positions import table_interpolation, vision_positions
from services.imageprep.prepared import ImageGeometry, PreparedImage
from services.imageprep.profiles import ProcessorSettings
from services.imageprep.resize import resize_rgb, rgb_to_tensor, smart_resize


def plan_geometry(height: int, width: int, settings: ProcessorSettings) -> ImageGeometry:
    """The resized size and patch grid of a height x width image under `settings`."""
    resized_h, resized_w = smart_resize(height, width, factor=settings.factor,
                                        min_pixels=settings.min_pixels,
                                        max_pixels=settings.max_pixels)
    return ImageGeometry(height=resized_h, width=resized_w, grid_t=1,
                         grid_h=resized_h // settings.patch_size,
                         grid_w=resized_w // settings.patch_size,
                         merge_size=settings.merge_size)


def resized_pixels(rgb: np.ndarray, geometry: ImageGeometry) -> torch.Tensor:
    """[1, 3, height, width] uint8: the image at its planned size."""
    return resize_rgb(rgb_to_tensor(rgb), geometry.height, geometry.width)


def process_image(decoded: DecodedImage, settings: ProcessorSettings) -> PreparedImage:
    """All tensors of one image, named as FetchPixels ships them."""
    geometry = plan_geometry(decoded.height, decoded.width, settings)
    resized = resized_pixels(decoded.rgb, geometry)
    positions = vision_positions(geometry)
    tensors: dict[str, np.ndarray] = {
        "grid_thw": np.array([[geometry.grid_t, geometry.grid_h, geometry.grid_w]],
                             dtype=np.int64),
        "vision_positions": positions.numpy(),
    }
    if settings.position_table_side:
        indices, weights = table_interpolation(positions, geometry, settings.position_table_side)
        tensors["interp_indices"] = indices.numpy()
        tensors["interp_weights"] = weights.numpy()
    tensors["cu_patches"] = np.array([0, geometry.num_patches], dtype=np.int32)
    return PreparedImage(identity=semantic_identity(decoded.rgb, settings),
                         profile=settings.profile, geometry=geometry, stored=tensors,
                         pixels=PixelPatches.from_resized(resized, settings))
