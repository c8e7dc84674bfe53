"""Compute priced per kernel: the kernels a step runs per block and pass at their own shapes
(blocks.py), what each activation checkpointing mode recomputes and keeps (recompute.py), the
efficiency tables per GPU with their sources (tables.py, data/), the memory-bound work eager
PyTorch runs, counted (eager.py, data/eager_ops.json), the pricing (pricing.py), the
scale one measured step gives (calibration.py) and the breakdown table (report.py)."""

from .blocks import LOSSES, Kernel, backward_of, block_forward, root_forward  # noqa: F401
from .calibration import ComputeCalibration, calibrate, calibrate_step, check_gpu, check_measured_step, read_calibration  # noqa: F401
from .eager import ATTENTION_CALLS, PRECISIONS, attention_call  # noqa: F401
from .measured import RecordRates, shapes_line  # noqa: F401
from .pricing import FlatRates, StepCompute, TableRates, model_flops_per_token, price_step  # noqa: F401
from .recompute import Checkpointing, activation_bytes, parse_checkpointing, recomputed  # noqa: F401
from .report import breakdown_table, bytes_line, compute_lines, sources_lines  # noqa: F401
from .step import overlap_loss, priced_compute, priced_for, priced_train, select_rates  # noqa: F401
from .tables import AttentionTable, KernelTable, load_table, parse_table, shipped  # noqa: F401
