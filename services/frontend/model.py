"""FrontendModel: everything the frontend knows about the model it serves.

Built once at startup from the opened model (manifest + verified assets) and the config: the
tokenizer, the chat renderer, the names the model answers to, its capabilities and context,
the parsers chosen for its output format, and the image placeholder tokens of vision models.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from services.common.core import NO_IMAGE_LIMITS, ImageLimits, Manifest, ModelSource
from services.common.errors import NotFoundError
from services.frontend.assets import FrontendAssets, load_assets
from services.frontend.chat.renderer import ChatRenderer
from services.frontend.parsers.select import choose_reasoning_parser, choose_tool_parser
from services.frontend.tokenizer import Tokenizer

log = logging.getLogger(__name__)

IMAGE_TOKEN = "<|image_pad|>"
VISION_START_TOKEN = "<|vision_start|>"


@dataclass(frozen=True, slots=True)
class ImageTokens:
    profile: str                       # imageprep profile (qwen3_vl, qwen2_5_vl)
    image_token_id: int                # placeholder the template writes once per image
    vision_start_token_id: int | None
    limits: ImageLimits = NO_IMAGE_LIMITS   # the core manifest's per-request image limits


class FrontendModel:
    def __init__(self, manifest: Manifest, assets: FrontendAssets, *, tool_parser: str = "auto",
                 reasoning_parser: str = "auto",
                 default_template_kwargs: dict[str, Any] | None = None,
                 chat_template_source: str = "") -> None:
        self.manifest = manifest
        self.assets = assets
        self.tokenizer: Tokenizer = assets.tokenizer
        self.renderer = ChatRenderer(assets.tokenizer, assets.templates, default_template_kwargs)
        default = assets.default_template
        template_text = "\n".join(t.source for t in assets.templates.values())
        self.chat_template = chat_template_source or (default.source if default else "")
        self.tool_parser = choose_tool_parser(
            tool_parser, model_type=manifest.model_type, architecture=manifest.architecture,
            template=template_text)
        vocabulary = set(assets.tokenizer.added_tokens.values())
        self.reasoning_parser = choose_reasoning_parser(reasoning_parser, template=template_text,
                                                        vocabulary=vocabulary,
                                                        model_type=manifest.model_type)
        self.image_tokens = self._image_tokens()
        self.max_model_len = manifest.max_model_len   # replaced by the engine's effective limit
        self.max_num_seqs = 0                         # the engine's admission bounds, once known
        self.max_waiting = 0
        self.kv_pool_tokens = 0                       # tokens one request may hold in its pool
        # the engine's word on images (ModelInfo.capabilities.vision: an architecture whose
        # encoder it runs, with a pixel source); None until the engine answered (the engine
        # refuses images itself meanwhile)
        self.engine_vision: bool | None = None
        log.info("frontend model %s: tool parser %s, reasoning parser %s, %d chat template(s)",
                 manifest.card_id, self.tool_parser or "none", self.reasoning_parser or "none",
                 len(assets.templates))

    @classmethod
    def load(cls, model: ModelSource, **options: Any) -> FrontendModel:
        return cls(model.manifest, load_assets(model), **options)

    @property
    def name(self) -> str:
        return self.manifest.card_id

    @property
    def supports_vision(self) -> bool:
        """Images are accepted: the checkpoint is a vision model with image tokens and a
        profile, and the engine runs its encoder (a Gemma 3 VLM's text part alone does not)."""
        return (self.manifest.capabilities.vision and self.image_tokens is not None and
                self.engine_vision is not False)

    def check_name(self, requested: str) -> None:
        if requested and requested not in self.manifest.names():
            raise NotFoundError(f"The model {requested!r} does not exist; this frontend serves "
                                f"{', '.join(self.manifest.names())}", param="model")

    def _image_tokens(self) -> ImageTokens | None:
        if not self.manifest.capabilities.vision:
            return None
        image_id = self.tokenizer.token_to_id(IMAGE_TOKEN)
        if image_id is None or not self.manifest.image_profile:
            log.warning("vision model without %s or an image profile: images are refused",
                        IMAGE_TOKEN)
            return None
        return ImageTokens(self.manifest.image_profile, image_id,
                           self.tokenizer.token_to_id(VISION_START_TOKEN),
                           self.manifest.image_limits)
