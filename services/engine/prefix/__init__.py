"""The prefix checkpoint cache: history keys (`history.py`) and checkpoint ownership (`cache.py`)."""
