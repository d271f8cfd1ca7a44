"""OpenAI-compatible routes: chat completions, completions, responses, models."""
