"""The Qwen vision transformers: packed images -> one feature row per merged image token.

    tower = Qwen2_5_VisionTower(config, device=..., dtype=...)   # or Qwen3VisionTower
    features = tower(images)          # list[ImageFeatures], one per VisionInput, in order

Qwen2.5-VL: patch embedding (no bias), RMSNorm blocks with the gated MLP. Most blocks attend
within windows of `window_size` pixels (whole merge blocks, row-major windows over each
image's merged grid, the last ones cut at the image edge); the `fullatt_block_indexes`
blocks attend over each whole image. Patches are reordered window by window before the
blocks (in whole merge blocks, so the merger still sees its 2x2 groups) and the merged
tokens are put back in image order at the end.

Qwen3-VL: patch embedding with a bias, plus the learned position table resampled to the
image's grid (bilinear: four taps and weights per patch from imageprep), LayerNorm blocks
attending per image, and `deepstack_visual_indexes`: after each of those blocks a merger of
its own turns the hidden states into features the decoder adds after its first layers.

Both: the 2-D rotary embedding rotates each head by the patch's row and column; the patch
merger concatenates each 2x2 merge block (norm, then MLP with an exact GELU) into one token.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model.layers import Linear, RMSNorm
from services.engine.model.layers.weights import parameter
from services.engine.model.vision.config import VisionConfig
from services.engine.model.vision.inputs import ImageFeatures, RawPixels, VisionInput, on_device
from services.engine.model.vision.layers import (
    LayerNorm,
    PatchEmbed,
    Segments,
    VisionBlock,
    Weights,
    vision_rotary_table,
)


def frame_seqlens(images: Sequence[VisionInput]) -> list[int]:
    """Cumulative patch offsets with every frame of every image its own segment."""
    bounds = [0]
    for image in images:
        t, h, w = image.grid
        bounds.extend(bounds[-1] + h * w * (i + 1) for i in range(t))
    return bounds


def window_layout(images: Sequence[VisionInput], config: VisionConfig
                  ) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL windows: (merged-token order [M] int64, cumulative window patch offsets)."""
    merge, unit = config.spatial_merge_size, config.merge_unit
    side = config.window_size // merge // config.patch_size
    order: list[torch.Tensor] = []
    bounds = [0]
    base = 0
    for image in images:
        t, h, w = image.grid
        lh, lw = h // merge, w // merge
        grid = torch.arange(t * lh * lw).view(t, lh, lw) + base
        for frame in range(t):
            for top in range(0, lh, side):
                for left in range(0, lw, side):
                    window = grid[frame, top:top + side, left:left + side].reshape(-1)
                    order.append(window)
                    bounds.append(bounds[-1] + window.numel() * unit)
        base += t * lh * lw
    return torch.cat(order), bounds


class PatchMerger(nn.Module):
    """2x2 merge blocks -> one token: norm (per patch, or Qwen3-VL's deepstack mergers after
    the shuffle), then Linear -> GELU -> Linear."""

    def __init__(self, config: VisionConfig, *, post_shuffle: bool, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.merge_unit
        self.post_shuffle = post_shuffle
        self.qwen2_5 = config.family == "qwen2_5_vl"
        self.ln_q: nn.Module | None = None
        self.norm: nn.Module | None = None
        if self.qwen2_5:
            self.ln_q = RMSNorm(config.hidden_size, 1e-6, device=device, dtype=dtype)
            self.mlp = nn.ModuleDict({
                "0": Linear(self.merged, self.merged, bias=True, device=device, dtype=dtype),
                "2": Linear(self.merged, config.out_hidden_size, bias=True, device=device,
                            dtype=dtype)})
        else:
            width = self.merged if post_shuffle else config.hidden_size
            self.norm = LayerNorm(width, 1e-6, device=device, dtype=dtype)
            self.linear_fc1 = Linear(self.merged, self.merged, bias=True, device=device,
                                     dtype=dtype)
            self.linear_fc2 = Linear(self.merged, config.out_hidden_size, bias=True,
                                     device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] (merge blocks contiguous) -> [N / 4, out_hidden]."""
        if self.ln_q is not None:
            x = self.ln_q(x).view(-1, self.merged)
            return self.mlp["2"](F.gelu(self.mlp["0"](x)))
        assert self.norm is not None
        x = self.norm(x.view(-1, self.merged)) if self.post_shuffle else \
            self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module, abc.ABC):
    """What both towers share. A packed pass is split in two, so that an encoder graph
    (vision/encoder_graphs.py) can capture the second part once per layout:
    - `plan(images)`: the pass's layout (segments, orders), a function of the images' grids
      alone (`layout_key`), built on the host and copied to the device;
    - `run(inputs, plan)`: pure device work from the per-image tensors (`pass_inputs`:
      pixel values and patch positions, plus Qwen3-VL's position-table taps) to the merged
      features in image order and the deepstack features."""

    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        # the blocks' attention: "sdpa" or "triton" (encoder_attention.py; engine setting
        # vision_attention)
        self.attention_backend = "sdpa"
        qwen3 = config.family == "qwen3_vl"
        self.patch_embed = PatchEmbed(config, bias=qwen3, device=device, dtype=dtype)
        self.blocks = nn.ModuleList([VisionBlock(config, device=device, dtype=dtype)
                                     for _ in range(config.depth)])
        self.merger = PatchMerger(config, post_shuffle=False, device=device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    def check(self, images: Sequence[VisionInput]) -> None:
        for image in images:
            if image.pixel_values.shape[-1] != self.config.patch_dim:
                raise ValueError(f"pixel_values rows hold {image.pixel_values.shape[-1]} "
                                 f"values; this model's patches hold {self.config.patch_dim}")

    @staticmethod
    def layout_key(images: Sequence[VisionInput]) -> tuple:
        """What `plan` depends on (with the attention backend): the images' grids."""
        return tuple(image.grid for image in images)

    def pass_inputs(self, images: Sequence[VisionInput]) -> list[torch.Tensor]:
        """The pass's per-image tensors on the device, concatenated: pixel values [N, P]
        and patch positions [N, 2] (Qwen3-VL adds its taps)."""
        device = self.device
        return [_on_device([image.pixel_values for image in images], device),
                torch.cat([image.positions for image in images]).to(device)]

    @abc.abstractmethod
    def plan(self, images: Sequence[VisionInput]) -> Any:
        """The pass's layout (each tower's own dataclass)."""

    @abc.abstractmethod
    def run(self, inputs: Sequence[torch.Tensor], plan: Any) -> list[torch.Tensor]:
        """`pass_inputs` -> [merged features in image order, *deepstack features]."""

    def rotary(self, positions: torch.Tensor) -> torch.Tensor:
        return vision_rotary_table(positions, self.config.head_dim, self.config.rope_theta)

    def features(self, outputs: Sequence[torch.Tensor], images: Sequence[VisionInput]
                 ) -> list[ImageFeatures]:
        """`run`'s outputs ([M, out] merged, then each deepstack's) cut per image."""
        sizes = [image.num_tokens(self.config.spatial_merge_size) for image in images]
        merged, *deepstack = [list(torch.split(t, sizes)) for t in outputs]
        return [ImageFeatures(f, tuple(d[i] for d in deepstack))
                for i, f in enumerate(merged)]

    @torch.inference_mode()
    def forward(self, images: Sequence[VisionInput]) -> list[ImageFeatures]:
        self.check(images)
        return self.features(self.run(self.pass_inputs(images), self.plan(images)), images)


def _on_device(parts: Sequence[torch.Tensor | RawPixels], device: torch.device
               ) -> torch.Tensor:
    """The images' host tensors concatenated on the device: each copied on its own, so
    pinned ones (vision/pixels.py) copy asynchronously; raw pixels become pixel_values
    there."""
    return torch.cat([on_device(part, device) for part in parts])


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """Qwen2.5-VL's layout of a pass: the patches' window order, both attention layouts,
    and the merged tokens' way back to image order."""

    patch_order: torch.Tensor   # int64 [N]: patches in window order
    rows: torch.Tensor          # int64 [N]: 0..N-1
    full: Segments              # whole images (the fullatt_block_indexes blocks)
    windows: Segments           # windows (the other blocks)
    restore: torch.Tensor       # int64 [M]: merged tokens, window order -> image order


class Qwen2_5_VisionTower(VisionTower):
    @torch.inference_mode()
    def plan(self, images: Sequence[VisionInput]) -> WindowPlan:
        device, unit = self.device, self.config.merge_unit
        order, window_bounds = window_layout(images, self.config)
        order = order.to(device)
        patch_order = (order[:, None] * unit + torch.arange(unit, device=device)).reshape(-1)
        return WindowPlan(patch_order, torch.arange(patch_order.shape[0], device=device),
                          Segments.of(frame_seqlens(images), device, self.attention_backend),
                          Segments.of(window_bounds, device, self.attention_backend),
                          torch.argsort(order))

    @torch.inference_mode()
    def run(self, inputs: Sequence[torch.Tensor], plan: WindowPlan) -> list[torch.Tensor]:
        pixels, positions = inputs
        x = self.patch_embed(pixels)[plan.patch_order]                    # [N, E]
        rotary = self.rotary(positions)[plan.patch_order]                 # [N, D]
        return [self.merger(self.run_blocks(x, rotary, plan))[plan.restore]]

    @torch.inference_mode()
    def run_blocks(self, x: torch.Tensor, rotary: torch.Tensor, plan: WindowPlan
                   ) -> torch.Tensor:
        """The blocks over patches in window order -> [N, E] in window order."""
        for index, block in enumerate(self.blocks):
            x = block(x, rotary, plan.rows,
                      plan.full if index in self.config.fullatt_block_indexes
                      else plan.windows)
        return x


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """Qwen3-VL's layout of a pass: every image one segment."""

    rows: torch.Tensor          # int64 [N]: 0..N-1
    segments: Segments


class Qwen3VisionTower(VisionTower):
    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__(config, device=device, dtype=dtype)
        self.pos_embed = Weights(parameter(config.num_position_embeddings,
                                           config.hidden_size, device=device, dtype=dtype))
        self.deepstack_merger_list = nn.ModuleList([
            PatchMerger(config, post_shuffle=True, device=device, dtype=dtype)
            for _ in config.deepstack_visual_indexes])

    def check(self, images: Sequence[VisionInput]) -> None:
        super().check(images)
        if any(image.interp_indices is None or image.interp_weights is None
               for image in images):
            raise ValueError("Qwen3-VL images need their position-table taps "
                             "(interp_indices, interp_weights)")

    def pass_inputs(self, images: Sequence[VisionInput]) -> list[torch.Tensor]:
        device = self.device
        return [*super().pass_inputs(images),
                _on_device([image.interp_indices for image in images], device),  # type: ignore[misc]
                _on_device([image.interp_weights for image in images], device)]  # type: ignore[misc]

    @torch.inference_mode()
    def plan(self, images: Sequence[VisionInput]) -> ImagePlan:
        device = self.device
        count = sum(image.num_patches for image in images)
        return ImagePlan(torch.arange(count, device=device),
                         Segments.of(frame_seqlens(images), device, self.attention_backend))

    @torch.inference_mode()
    def run(self, inputs: Sequence[torch.Tensor], plan: ImagePlan) -> list[torch.Tensor]:
        pixels, positions, indices, weights = inputs
        x = self.patch_embed(pixels)
        table = self.pos_embed.weight
        x = x + (table[indices] * weights[:, :, None].to(table.dtype)).sum(1).to(x.dtype)
        rotary = self.rotary(positions)
        layers = self.config.deepstack_visual_indexes
        deepstack: list[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            x = block(x, rotary, plan.rows, plan.segments)
            if index in layers:
                deepstack.append(self.deepstack_merger_list[layers.index(index)](x))
        return [self.merger(x), *deepstack]
