"""Which processor settings a request gets: its profile name, the served model's checkpoint.

Without a configured model imageprep serves the built-in profiles by name (the frontend passes
the core manifest's `image_profile`). With `--model CORE`, the core's `image_profile` becomes
the default for requests that name none, and that profile takes the checkpoint's
preprocessor_config.json and vision config into account; other profiles keep their defaults.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.common.core import ROLE_CONFIG, ROLE_PREPROCESSOR, open_model
from services.common.errors import ValidationError
from services.imageprep.profiles import ProcessorSettings, builtin_profile, settings_from_checkpoint

log = logging.getLogger(__name__)

PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True, slots=True)
class ProfileResolver:
    default_profile: str = ""                      # used when a request names no profile
    model_settings: ProcessorSettings | None = None  # the served checkpoint's own settings

    @classmethod
    def from_model(cls, path: str) -> ProfileResolver:
        if not path:
            return cls()
        model = open_model(path, verify=(ROLE_CONFIG, ROLE_PREPROCESSOR))
        profile = model.manifest.image_profile
        if not profile:
            log.warning("model %s has no image profile; requests must name one", path)
            return cls()
        preprocessor = (model.read_json(PREPROCESSOR_FILE)
                        if model.path(PREPROCESSOR_FILE).is_file() else None)
        settings = settings_from_checkpoint(profile, preprocessor, model.config)
        log.info("image profile %s from %s", profile, path)
        return cls(default_profile=profile, model_settings=settings)

    def resolve(self, profile: str, min_pixels: int | None,
                max_pixels: int | None) -> ProcessorSettings:
        name = profile or self.default_profile
        if not name:
            raise ValidationError("profile is required (this imageprep serves no default model)",
                                  param="profile")
        if self.model_settings is not None and name == self.model_settings.profile:
            base = self.model_settings
        else:
            base = builtin_profile(name)
        return base.with_pixel_bounds(min_pixels, max_pixels)
