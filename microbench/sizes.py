"""Former home of size and number parsing, now `microbench.units`; kept importable for one
release so that out-of-tree probes (MICROBENCH_PROBES) and branches written against it still
work. New code imports from `microbench.units`."""

from .units import (  # noqa: F401
    MEMORY_SHARE,
    format_bytes_human,
    format_size,
    memory_shortfall,
    parse_bandwidth_bytes_per_s,
    parse_duration_s,
    parse_list,
    parse_number,
    parse_positive,
    parse_positive_int,
    parse_size,
    parse_sizes,
)
