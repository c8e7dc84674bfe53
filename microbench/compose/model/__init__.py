"""Model descriptions with real shapes (shapes.py), the presets (presets.py) and the shapes read
from a Hugging Face config.json (hf_config.py)."""

from .hf_config import from_hf_config
from .presets import PRESETS, preset
from .shapes import CrudeModel, ModelShape, VisionTower, format_params

__all__ = ["PRESETS", "CrudeModel", "ModelShape", "VisionTower", "format_params", "from_hf_config", "preset"]
