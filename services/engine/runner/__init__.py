"""The runner: owns every tensor (model, KV pages, snapshot rows) and executes committed steps."""
