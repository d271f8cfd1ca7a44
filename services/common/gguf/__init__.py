"""GGUF checkpoints (the files llama.cpp and Ollama users have) read as Hugging Face ones.

- `reader.py`: `open_gguf(path)` -> `GGUFFile` (metadata as Python values, the tensor table),
  refusing files that are not GGUF or are truncated;
- `architectures.py`: the supported `general.architecture` values and their HF names;
- `config.py`: `hf_config(gguf_file)` -> config.json; `rope.py`: its `rope_scaling`;
- `vocab.py`, `tokenizer_bpe.py`, `tokenizer_spm.py`, `tokenizer.py`: `hf_tokenizer(gguf_file)`
  -> tokenizer.json, tokenizer_config.json (chat template) and the stop token ids;
- `names.py`, `tensors.py`: `iter_hf_tensors(path)` -> (HF name, float32 tensor in HF shape),
  `count_parameters`, `check_tensors`;
- `core.py`: the files of a prepared core written from a GGUF file.
"""
