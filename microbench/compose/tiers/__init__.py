"""Storage tiers: bandwidths read from storage records (records.py), described tiers' durability
and cache options (options.py)."""
