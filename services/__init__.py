"""Helios services: frontend, imageprep, engine, their shared code (common) and the CLI."""
