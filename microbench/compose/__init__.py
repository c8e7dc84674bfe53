"""The composer: pure functions from saved result records and a model description to a
predicted FSDP step time, memory per GPU and checkpoint time per storage tier. No I/O except
reading records in the CLI layer, so every function is testable with golden inputs."""

from .checkpoint.tier import CheckpointSpec, checkpoint_bytes, checkpoint_parts, predict_tier, required_write_gbps  # noqa: F401
from .curves import Curve, Network, network_from_record, synthetic_network  # noqa: F401
from .fsdp import MemoryCheck, StepPrediction, TrainSpec, memory_check, predict_step  # noqa: F401
from .hardware import GPUS, Gpu  # noqa: F401
from .model import PRESETS, CrudeModel, ModelShape, from_hf_config  # noqa: F401
