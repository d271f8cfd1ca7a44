"""The engine's image path: a request's multimodal prompt (spans, identities, mRoPE rows),
the pixel source (imageprep FetchPixels), the device feature cache and the stage that turns a
step's image rows into ImageEmbeds (encoding only what is not cached)."""
