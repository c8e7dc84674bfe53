"""`verify job`: a whole short job on a storage tier per phase against compose's job timeline: the
plan, the tiers, the probes it predicts from, what each rank runs, the launching side, the report."""
