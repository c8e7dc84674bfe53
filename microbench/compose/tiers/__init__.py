"""Storage tiers: what one is (tier.py: a Tier, described or measured), one described by --tier
(described.py) and one measured by a storage record (records.py)."""

from .tier import Tier

__all__ = ["Tier"]
