"""Anthropic-compatible routes: messages and count_tokens."""
