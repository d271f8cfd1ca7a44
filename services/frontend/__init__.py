"""The frontend: tokenizer, chat templates, detokenization, stop strings, reasoning/tool parsing."""
