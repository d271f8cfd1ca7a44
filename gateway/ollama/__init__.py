"""Ollama-native routes: chat, generate, tags, show, version."""
