"""The vision towers of the vision-language models (qwen_vl.py): their configs, the typed
objects between imageprep, the tower and the decoder, the shared layers (packed
variable-length attention, 2-D rotary, patch embedding) and the Qwen2.5-VL / Qwen3-VL
towers."""
