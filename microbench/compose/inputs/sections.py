"""`microbench compose`'s flags, declared once (core/sections.py): one section per --help group,
each field a flag with its default, its help and its parser (parsers.py). The sections about one
step are in step_sections.py, those about the job around it in job_sections.py; this gathers them
and checks what spans sections. Every value is parsed when argv is read, so misuse is refused
before anything is read or printed; the files a flag names are read by build.py. A new composer
input is one field in a section and its parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import UsageError
from .job_sections import Job, Loading, Output, Storage
from .step_sections import Compute, Model, Network, Sharding, Training


@dataclass
class ComposeOptions:
    """Everything `microbench compose` is asked, typed."""

    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    compute: Compute = field(default_factory=Compute)
    network: Network = field(default_factory=Network)
    sharding: Sharding = field(default_factory=Sharding)
    storage: Storage = field(default_factory=Storage)
    loading: Loading = field(default_factory=Loading)
    job: Job = field(default_factory=Job)
    output: Output = field(default_factory=Output)

    def check(self) -> None:
        c, t = self.compute, self.training
        if c.measured_step is None:
            return
        if c.gpu is None:
            raise UsageError(
                f"--measured-step {c.measured_step:g} scales a GPU's kernel rates: name the GPU it was "
                f"measured on, e.g. --gpu h100"
            )
        if t.nodes is None and t.gpus_per_node is None and t.ranks is None:
            raise UsageError(
                f"--measured-step {c.measured_step:g} needs the configuration it was measured on: give "
                f"its --nodes and --gpus-per-node (and --micro-batch, --seq-len as it ran), e.g. --nodes 1 "
                f"--gpus-per-node 8"
            )
