"""Chat templates: HF-compatible Jinja rendering with message marks, and token endpoints."""
