"""The engine's model: config parsing, weight loading, the paged-KV forward pass and its ops.

Module map: docs/engine-model.md. The forward contract lives in `attention.py`; the primitive
ops (plain-torch references and the dispatch to `services.engine.kernels`) in `ops.py`.
"""
