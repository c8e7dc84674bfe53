"""microbench: collective, link, storage and checkpoint microbenchmarks for LLM-training clusters."""

__version__ = "0.1.0"

from .core.errors import MicrobenchError, ProbeUnavailable, RunError, UsageError  # noqa: E402,F401
