"""A random checkpoint in the Qwen3-Embedding layout: transformers' `Qwen3Model` (no lm_head)
saved as safetensors with the demo model's tokenizer and sentence-transformers' modules.json +
1_Pooling/config.json (last-token or mean pooling, a Normalize module).

    model_dir, model = build_embedding_checkpoint(root, demo_model_dir, mode="last")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

HIDDEN = 48


def build_embedding_checkpoint(root: Path, demo_model_dir: Path, *, mode: str = "last",
                               seed: int = 11) -> tuple[Path, Any]:
    import torch
    import transformers

    config = json.loads((demo_model_dir / "config.json").read_text())
    config.update(tie_word_embeddings=False, num_hidden_layers=2, hidden_size=HIDDEN,
                  head_dim=16, num_attention_heads=3, num_key_value_heads=1,
                  intermediate_size=96, torch_dtype="float32")
    config.pop("architectures", None)
    torch.manual_seed(seed)
    model = transformers.Qwen3Model(transformers.Qwen3Config(**config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)      # norms that are not exactly one
    model_dir = root / f"qwen3-embedding-{mode}"
    model.save_pretrained(model_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (demo_model_dir / name).is_file():
            shutil.copyfile(demo_model_dir / name, model_dir / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": mode == "last"}))
    return model_dir, model
