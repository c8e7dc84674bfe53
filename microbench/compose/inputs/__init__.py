"""What the composer is asked: compose's flags declared once in sections (sections.py gathering
step_sections.py and job_sections.py, their values' parsers in parsers.py), and the records they
name read into the composer's typed inputs (build.py)."""

from .build import ComposeInputs, ComputeRate, build
from .parsers import DEFAULT_MFU
from .sections import ComposeOptions

__all__ = ["ComposeInputs", "ComposeOptions", "ComputeRate", "DEFAULT_MFU", "build"]
