"""Streaming parsers for model output: reasoning blocks and tool calls."""
