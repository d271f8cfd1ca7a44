"""Prepared cores: a checked model directory plus a manifest that fingerprints every file.

`helios prepare MODEL_DIR --out CORE` inspects a Hugging Face checkpoint directory (config.json,
safetensors weights, tokenizer.json, tokenizer_config.json / chat_template.jinja) and writes CORE:
the files (hard-linked where possible) and `helios-core.json`, the manifest. Every service opens
its model through `open_model`, which for a core verifies the SHA-256 of the files it needs and
names the first one that does not match; a plain model directory is inspected in memory.

A GGUF file (`helios prepare model.gguf --out CORE`) becomes a core holding the .gguf as its
weights beside a config.json and tokenizer files generated from its metadata
(services.common.gguf.core); `open_model("model.gguf")` prepares such a core once in the cache
and opens it.

The manifest's `identity` (32 bytes, hex) is BLAKE2b-256 over the architecture and the hashes of
config, weights, tokenizer and chat template: the prefix cache seeds its keys with it, so two
engines agree on cached prefixes exactly when they serve the same model and recipe.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.assets import sha256_file
from services.common.digest_cache import sha256_files
from services.common.errors import ManifestError, ValidationError
from services.common.quantization import parse_quantization
from services.common.tokenizer_json import read_added_tokens

MANIFEST_NAME = "helios-core.json"
MANIFEST_FORMAT = 1

# Roles of the files a core carries; `open_model(verify=...)` checks a subset by role.
ROLE_CONFIG = "config"
ROLE_WEIGHTS = "weights"
ROLE_TOKENIZER = "tokenizer"
ROLE_TOKENIZER_CONFIG = "tokenizer_config"
ROLE_CHAT_TEMPLATE = "chat_template"
ROLE_GENERATION_CONFIG = "generation_config"
ROLE_PREPROCESSOR = "preprocessor"
ROLE_OTHER = "other"
TOKENIZER_ROLES = (ROLE_TOKENIZER, ROLE_TOKENIZER_CONFIG, ROLE_CHAT_TEMPLATE, ROLE_CONFIG,
                   ROLE_GENERATION_CONFIG, ROLE_PREPROCESSOR)

_KNOWN_FILES = {
    "config.json": ROLE_CONFIG,
    "tokenizer.json": ROLE_TOKENIZER,
    "tokenizer_config.json": ROLE_TOKENIZER_CONFIG,
    "chat_template.jinja": ROLE_CHAT_TEMPLATE,
    "chat_template.json": ROLE_CHAT_TEMPLATE,
    "generation_config.json": ROLE_GENERATION_CONFIG,
    "preprocessor_config.json": ROLE_PREPROCESSOR,
    "special_tokens_map.json": ROLE_OTHER,
    "model.safetensors.index.json": ROLE_OTHER,
    # sentence-transformers: the embedding's pooling and normalization (engine/model/pooling)
    "modules.json": ROLE_OTHER,
    "1_Pooling/config.json": ROLE_OTHER,
}

_IMAGE_PROFILES = {
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
}


@dataclass(frozen=True)
class FileFingerprint:
    path: str        # relative to the core root
    role: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ImageLimits:
    """What one request may send a vision core (0: no limit of the core's own; imageprep's
    configured limits still apply). `helios prepare --max-images/--max-image-bytes/
    --max-image-pixels` writes them; every refusal names the field (`source`)."""

    max_images: int = 0              # images in one request
    max_image_bytes: int = 0         # encoded bytes of one image
    max_image_pixels: int = 0        # decoded width x height of one image

    ORIGIN = f"the model core's manifest ({MANIFEST_NAME})"

    @staticmethod
    def source(name: str, origin: str = ORIGIN) -> str:
        """Where limit `name` comes from, as refusals state it."""
        return f"image_limits.{name} of {origin}"


NO_IMAGE_LIMITS = ImageLimits()     # a text core's (and an older vision core's)
# what a vision core allows unless `helios prepare` is told otherwise
DEFAULT_IMAGE_LIMITS = ImageLimits(max_images=32, max_image_bytes=20 << 20,
                                   max_image_pixels=64 << 20)


@dataclass(frozen=True)
class CoreCapabilities:
    tools: bool = False
    vision: bool = False
    reasoning: bool = False


@dataclass(frozen=True)
class Manifest:
    """Everything a service needs to know about a model before opening its weights."""

    model_id: str                          # checkpoint identifier (the card's `root`)
    served_names: tuple[str, ...]          # aliases; the first nonempty one is the card id
    identity: str                          # 64 hex chars: 32-byte model/recipe identity
    architecture: str                      # Qwen3ForCausalLM, LlamaForCausalLM ...
    model_type: str                        # qwen3, llama ...
    dtype: str                             # checkpoint dtype: bfloat16, float16, float32
    max_model_len: int                     # context limit
    vocab_size: int
    num_parameters: int
    weight_bytes: int
    eos_token_ids: tuple[int, ...]
    capabilities: CoreCapabilities
    tokenizer_file: str                    # relative path of tokenizer.json
    chat_template_file: str                # file the template comes from ("" if none)
    chat_template_sha256: str              # SHA-256 of the template text ("" if none)
    image_profile: str = ""                # imageprep profile: "", qwen3_vl, qwen2_5_vl
    image_limits: ImageLimits = NO_IMAGE_LIMITS  # per-request image limits (vision cores)
    context_hint: str = ""                 # appended to context-overflow errors
    capacity_hint: str = ""                # appended to capacity errors
    capture_batch_sizes: tuple[int, ...] = ()  # decode graph capacities (empty: engine chooses)
    quantization: str = ""                 # FP8 scheme of the checkpoint ("": dense weights)
    created_at: int = 0                    # unix seconds
    files: tuple[FileFingerprint, ...] = ()
    format: int = MANIFEST_FORMAT

    @property
    def card_id(self) -> str:
        return next((name for name in self.served_names if name), self.model_id)

    @property
    def identity_bytes(self) -> bytes:
        return bytes.fromhex(self.identity)

    def names(self) -> tuple[str, ...]:
        """Every name this model answers to: the card id, aliases and the checkpoint id."""
        ordered = [self.card_id, *self.served_names, self.model_id]
        return tuple(dict.fromkeys(n for n in ordered if n))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "manifest") -> Manifest:
        try:
            data = json.loads(text)
            if data.get("format") != MANIFEST_FORMAT:
                raise ManifestError(
                    f"{source}: unsupported manifest format {data.get('format')!r} "
                    f"(this Helios reads format {MANIFEST_FORMAT})")
            data["served_names"] = tuple(data["served_names"])
            data["eos_token_ids"] = tuple(data["eos_token_ids"])
            data["capture_batch_sizes"] = tuple(data.get("capture_batch_sizes", ()))
            data["capabilities"] = CoreCapabilities(**data["capabilities"])
            data["image_limits"] = ImageLimits(**data.get("image_limits", {}))
            data["files"] = tuple(FileFingerprint(**f) for f in data["files"])
            return cls(**data)
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{source}: malformed manifest: {exc}") from exc


@dataclass(frozen=True)
class ModelSource:
    """An opened model: its root directory and manifest (read-only)."""

    root: Path
    manifest: Manifest
    is_core: bool = False
    _json_cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def path(self, relative: str) -> Path:
        return self.root / relative

    def read_json(self, relative: str) -> dict[str, Any]:
        if relative not in self._json_cache:
            self._json_cache[relative] = json.loads(self.path(relative).read_text())
        return self._json_cache[relative]

    @property
    def config(self) -> dict[str, Any]:
        return self.read_json("config.json")

    def files_with_role(self, role: str) -> list[FileFingerprint]:
        return [f for f in self.manifest.files if f.role == role]

    def chat_template(self) -> str | None:
        return _read_chat_template(self.root, self.manifest.chat_template_file)


# ---------------------------------------------------------------------------------------------
# Inspection


def _read_chat_template(root: Path, relative: str) -> str | None:
    if not relative:
        return None
    path = root / relative
    if relative.endswith(".jinja"):
        return path.read_text(encoding="utf-8")
    data = json.loads(path.read_text(encoding="utf-8"))
    template = data.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _chat_template_file(root: Path) -> str:
    for candidate in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if (root / candidate).is_file() and _read_chat_template(root, candidate):
            return candidate
    return ""


def _safetensors_parameters(path: Path) -> int:
    """Count parameters from a safetensors header without reading the tensors."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        total += count
    return total


def _weight_parameters(path: Path) -> int:
    if path.suffix == ".gguf":
        from services.common.gguf.reader import open_gguf
        from services.common.gguf.tensors import count_parameters

        return count_parameters(open_gguf(path))
    return _safetensors_parameters(path)


def _eos_ids(root: Path, config: dict[str, Any], added_tokens: list[Any]) -> tuple[int, ...]:
    ids: list[int] = []

    def add(value: Any) -> None:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and item not in ids:
                ids.append(item)

    gen_path = root / "generation_config.json"
    if gen_path.is_file():
        add(json.loads(gen_path.read_text()).get("eos_token_id"))
    add(config.get("eos_token_id"))
    add(config.get("text_config", {}).get("eos_token_id"))
    if not ids:
        tok_cfg_path = root / "tokenizer_config.json"
        if tok_cfg_path.is_file():
            eos = json.loads(tok_cfg_path.read_text()).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
            for added in added_tokens:
                if added.get("content") == eos:
                    add(added["id"])
    return tuple(ids)


def _family_quantization(config: dict[str, Any]) -> str:
    """A quantization_config a family reads itself (gpt-oss's mxfp4), by its method."""
    quant = config.get("quantization_config") or {}
    return str(quant.get("quant_method") or "") if isinstance(quant, dict) else ""


def _hash_files(root: Path, relatives: list[str]) -> dict[str, str]:
    """SHA-256 per file: remembered while a file is unchanged (digest_cache.py), else hashed
    (hashlib releases the GIL on large buffers: shards hash in parallel)."""
    def compute(paths: list[Path]) -> list[str]:
        workers = min(8, max(1, len(paths)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(sha256_file, paths))

    digests = sha256_files([root / rel for rel in relatives], compute)
    return {rel: digests[root / rel] for rel in relatives}


def _identity(architecture: str, fingerprints: list[FileFingerprint], template_sha: str) -> str:
    digest = hashlib.blake2b(digest_size=32, person=b"helios-model-id")
    digest.update(f"format={MANIFEST_FORMAT};arch={architecture};".encode())
    for fp in sorted(fingerprints, key=lambda f: f.path):
        if fp.role in (ROLE_CONFIG, ROLE_WEIGHTS, ROLE_TOKENIZER):
            digest.update(f"{fp.role}:{fp.path}:{fp.sha256};".encode())
    digest.update(f"template:{template_sha};".encode())
    return digest.hexdigest()


def inspect_model_dir(
    model_dir: Path,
    *,
    model_id: str | None = None,
    served_names: tuple[str, ...] = (),
    max_model_len: int | None = None,
    context_hint: str = "",
    capacity_hint: str = "",
    capture_batch_sizes: tuple[int, ...] = (),
    allow_missing_weights: bool = False,
    num_parameters: int | None = None,
    image_limits: ImageLimits | None = None,
) -> Manifest:
    """Check a Hugging Face checkpoint directory and describe it as a manifest.

    The weights are its *.safetensors files, else its one *.gguf file (a GGUF core).
    `allow_missing_weights` accepts a directory with config and tokenizer but no weights (an
    engine run with `--load-format dummy`, speed benchmarks at real shapes); its manifest lists
    no weight files and counts the parameters as 0. `num_parameters` is a count the caller
    already has (a GGUF's, read when its core was written); else the weights' headers are read.
    A vision core records `image_limits` (DEFAULT_IMAGE_LIMITS when not given)."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValidationError(f"{model_dir} is not a model directory: config.json is missing")
    config = json.loads(config_path.read_text())
    architectures = config.get("architectures") or []
    if not architectures:
        raise ValidationError(f"{config_path}: no `architectures` entry")
    architecture = architectures[0]
    weights = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not weights:
        weights = sorted(p.name for p in model_dir.glob("*.gguf"))
        if len(weights) > 1:
            raise ValidationError(f"{model_dir}: {len(weights)} *.gguf files; a model directory "
                                  "holds one")
    if not weights and not allow_missing_weights:
        raise ValidationError(f"{model_dir}: no weights (*.safetensors or one *.gguf file)")
    if not (model_dir / "tokenizer.json").is_file():
        raise ValidationError(f"{model_dir}: tokenizer.json is missing")

    relatives = [name for name in sorted(_KNOWN_FILES) if (model_dir / name).is_file()] + weights
    digests = _hash_files(model_dir, relatives)
    fingerprints = [
        FileFingerprint(rel, _KNOWN_FILES.get(rel, ROLE_WEIGHTS), digests[rel],
                        (model_dir / rel).stat().st_size)
        for rel in relatives
    ]
    template_file = _chat_template_file(model_dir)
    template = _read_chat_template(model_dir, template_file) or ""
    template_sha = hashlib.sha256(template.encode()).hexdigest() if template else ""
    added_tokens = read_added_tokens((model_dir / "tokenizer.json").read_text())
    vocab_tokens = {t.get("content") for t in added_tokens}
    text_config = config.get("text_config", config)
    context = max_model_len or text_config.get("max_position_embeddings") or 4096
    scheme = parse_quantization(config)   # an unsupported quantization_config fails here
    capabilities = CoreCapabilities(
        tools="tools" in template,
        vision="vision_config" in config or architecture in _IMAGE_PROFILES,
        reasoning="<think>" in template or "<think>" in vocab_tokens,
    )
    return Manifest(
        model_id=model_id or model_dir.resolve().name,
        served_names=tuple(served_names),
        identity=_identity(architecture, fingerprints, template_sha),
        architecture=architecture,
        model_type=str(config.get("model_type", "")),
        dtype=str(text_config.get("torch_dtype") or text_config.get("dtype") or
                  config.get("torch_dtype") or "float32"),
        max_model_len=int(context),
        vocab_size=int(text_config.get("vocab_size", 0)),
        num_parameters=(num_parameters if num_parameters is not None
                        else sum(_weight_parameters(model_dir / w) for w in weights)),
        weight_bytes=sum(fp.size for fp in fingerprints if fp.role == ROLE_WEIGHTS),
        eos_token_ids=_eos_ids(model_dir, config, added_tokens),
        capabilities=capabilities,
        tokenizer_file="tokenizer.json",
        chat_template_file=template_file,
        chat_template_sha256=template_sha,
        image_profile=_IMAGE_PROFILES.get(architecture, ""),
        image_limits=(image_limits or DEFAULT_IMAGE_LIMITS) if capabilities.vision
        else NO_IMAGE_LIMITS,
        context_hint=context_hint,
        capacity_hint=capacity_hint,
        capture_batch_sizes=tuple(capture_batch_sizes),
        quantization=scheme.name if scheme else _family_quantization(config),
        created_at=int(time.time()),
        files=tuple(fingerprints),
    )


# ---------------------------------------------------------------------------------------------
# Prepare and open


def prepare_core(model_dir: Path, out: Path, **options: Any) -> Manifest:
    """Write a core: the model's files (hard-linked, else copied) and its manifest. `model_dir`
    may also be a GGUF file (services.common.gguf.core.prepare_gguf_core)."""
    model_dir, out = Path(model_dir), Path(out)
    if _is_gguf(model_dir):
        from services.common.gguf.core import prepare_gguf_core

        return prepare_gguf_core(model_dir, out, **options)
    manifest = inspect_model_dir(model_dir, **options)
    if out.exists() and any(out.iterdir()):
        raise ValidationError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for fp in manifest.files:
        source, target = model_dir / fp.path, out / fp.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    (out / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def verify_core(root: Path, manifest: Manifest, roles: tuple[str, ...] | None = None) -> None:
    """Check the size and SHA-256 of every file with one of `roles` (all when None)."""
    chosen = [fp for fp in manifest.files if roles is None or fp.role in roles]
    for fp in chosen:
        path = root / fp.path
        if not path.is_file():
            raise ManifestError(f"core {root}: {fp.path} is missing", param=fp.path)
        if path.stat().st_size != fp.size:
            raise ManifestError(
                f"core {root}: {fp.path} has {path.stat().st_size} bytes, the manifest says "
                f"{fp.size}", param=fp.path)
    digests = _hash_files(root, [fp.path for fp in chosen])
    for fp in chosen:
        if digests[fp.path] != fp.sha256:
            raise ManifestError(
                f"core {root}: {fp.path} does not match its fingerprint (SHA-256 "
                f"{digests[fp.path]}, manifest {fp.sha256})", param=fp.path)
    if manifest.chat_template_file and (roles is None or ROLE_CHAT_TEMPLATE in roles or
                                        ROLE_TOKENIZER_CONFIG in roles):
        template = _read_chat_template(root, manifest.chat_template_file) or ""
        if hashlib.sha256(template.encode()).hexdigest() != manifest.chat_template_sha256:
            raise ManifestError(
                f"core {root}: the chat template in {manifest.chat_template_file} does not "
                "match its fingerprint", param=manifest.chat_template_file)


def _is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    from services.common.gguf.reader import is_gguf_file

    return path.suffix.lower() == ".gguf" or is_gguf_file(path)


def open_model(path: Path | str, *, verify: tuple[str, ...] | None = None,
               allow_missing_weights: bool = False) -> ModelSource:
    """Open a prepared core (verifying files with the given roles; all when None), a model dir
    (one without weights only with `allow_missing_weights`: see inspect_model_dir), or a GGUF
    file (its cached core, prepared on first use: services.common.gguf.core.gguf_core).

    Unknown paths and malformed manifests raise ValidationError / ManifestError.
    """
    root = Path(path)
    if _is_gguf(root):
        from services.common.gguf.core import gguf_core

        root = gguf_core(root)
    manifest_path = root / MANIFEST_NAME
    if manifest_path.is_file():
        manifest = Manifest.from_json(manifest_path.read_text(), source=str(manifest_path))
        verify_core(root, manifest, verify)
        return ModelSource(root, manifest, is_core=True)
    if (root / "config.json").is_file():
        return ModelSource(root, inspect_model_dir(
            root, allow_missing_weights=allow_missing_weights))
    raise ValidationError(
        f"{root} is neither a prepared core ({MANIFEST_NAME}) nor a model directory "
        "(config.json)")
