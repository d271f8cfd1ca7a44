"""The live-request scheduler: slots, token-count planning, plan -> commit -> complete."""
