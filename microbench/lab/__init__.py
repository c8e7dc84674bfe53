"""A shaped multi-host network on one Linux box, rank placement on it, and hunting slow hosts."""
