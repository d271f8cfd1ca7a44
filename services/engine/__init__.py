"""The model engine: weights, paged KV cache, prefix cache, scheduler, runner (GPU or CPU)."""
