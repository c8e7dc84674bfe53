"""The composer: pure functions from saved result records and a model description to a
predicted FSDP step time and checkpoint time per storage tier. No I/O except reading records
in the CLI layer, so every function is testable with golden inputs."""

from .checkpoint import CheckpointSpec, checkpoint_bytes, predict_tier, required_write_gbps  # noqa: F401
from .curves import Curve  # noqa: F401
from .fsdp import PRESETS, ModelSpec, StepPrediction, TrainSpec, predict_step  # noqa: F401
