"""Load a model's tokenizer and chat templates, fingerprinting the exact bytes that are parsed.

Each asset file is read once; its SHA-256 is computed over the bytes that are then parsed and
compared with the core's manifest, so what runs is what the manifest names (a mismatch is a
ManifestError naming the file). The chat template comes from `chat_template.jinja` /
`chat_template.json` / `tokenizer_config.json` (a string or a list of named templates).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from services.common.core import ModelSource
from services.common.errors import ManifestError
from services.frontend.chat.template import ChatTemplate
from services.frontend.tokenizer import Tokenizer


@dataclass(frozen=True)
class FrontendAssets:
    tokenizer: Tokenizer
    templates: dict[str, ChatTemplate]             # name -> template ("default", "tool_use" ...)
    fingerprints: dict[str, str] = field(default_factory=dict)  # file -> SHA-256 loaded

    @property
    def default_template(self) -> ChatTemplate | None:
        return self.templates.get("default") or next(iter(self.templates.values()), None)


def _read_checked(model: ModelSource, relative: str, fingerprints: dict[str, str]) -> bytes:
    path = model.path(relative)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc}", param=relative) from exc
    digest = hashlib.sha256(data).hexdigest()
    expected = {fp.path: fp.sha256 for fp in model.manifest.files}.get(relative)
    if expected is not None and expected != digest:
        raise ManifestError(
            f"{path} does not match its fingerprint (SHA-256 {digest}, manifest {expected})",
            param=relative)
    fingerprints[relative] = digest
    return data


def _named_templates(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {str(item.get("name")): str(item["template"]) for item in value
                if isinstance(item, dict) and isinstance(item.get("template"), str)}
    return {}


def load_assets(model: ModelSource) -> FrontendAssets:
    manifest = model.manifest
    fingerprints: dict[str, str] = {}
    tokenizer_text = _read_checked(model, manifest.tokenizer_file, fingerprints).decode("utf-8")
    config: dict[str, Any] = {}
    if model.path("tokenizer_config.json").is_file():
        config = json.loads(_read_checked(model, "tokenizer_config.json", fingerprints))
    sources: dict[str, str] = {}
    template_file = manifest.chat_template_file
    if template_file.endswith(".jinja"):
        sources = {"default": _read_checked(model, template_file, fingerprints).decode("utf-8")}
    elif template_file == "tokenizer_config.json":
        sources = _named_templates(config.get("chat_template"))
    elif template_file:
        data = json.loads(_read_checked(model, template_file, fingerprints))
        sources = _named_templates(data.get("chat_template"))
    default = sources.get("default") or next(iter(sources.values()), "")
    if manifest.chat_template_sha256 and default:
        digest = hashlib.sha256(default.encode()).hexdigest()
        if digest != manifest.chat_template_sha256:
            raise ManifestError(
                f"the chat template in {template_file} does not match its fingerprint "
                f"(SHA-256 {digest}, manifest {manifest.chat_template_sha256})",
                param=template_file)
    templates: dict[str, ChatTemplate] = {}
    for name, source in sources.items():
        try:
            templates[name] = ChatTemplate(source, name=name)
        except Exception as exc:
            raise ManifestError(f"the chat template {name!r} in {template_file} does not "
                                f"compile: {exc}", param=template_file) from exc
    return FrontendAssets(Tokenizer(tokenizer_text, config), templates, fingerprints)


def load_tokenizer_dir(directory: Any) -> FrontendAssets:
    """Assets from a bare tokenizer directory (tokenizer.json, tokenizer_config.json and an
    optional chat_template.jinja) without a manifest: tools, tests and benchmarks."""
    from pathlib import Path

    root = Path(directory)
    tokenizer_text = (root / "tokenizer.json").read_text(encoding="utf-8")
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    jinja = root / "chat_template.jinja"
    sources = ({"default": jinja.read_text(encoding="utf-8")} if jinja.is_file()
               else _named_templates(config.get("chat_template")))
    templates = {name: ChatTemplate(source, name=name) for name, source in sources.items()}
    return FrontendAssets(Tokenizer(tokenizer_text, config), templates)
