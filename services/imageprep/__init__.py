"""Image preparation: safe decoding, Qwen-VL preprocessing, prompt expansion, retention cache."""
