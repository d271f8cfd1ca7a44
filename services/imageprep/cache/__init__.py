"""The retention cache of prepared images: memory, disk and Redis tiers behind one facade."""
