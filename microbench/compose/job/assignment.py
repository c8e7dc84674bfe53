"""Where a job's storage phases live, each a tier's name: batches (--data), the model at start and
after a restart (--model-from) and checkpoints (--ckpt-to); in compose's what-if also the network
it runs on. compose ranks every assignment (whatif.py); verify job runs some and measures them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PHASES = ("data", "model_from", "ckpt_to")
PHASE_FLAGS = {"data": "--data", "model_from": "--model-from", "ckpt_to": "--ckpt-to"}


@dataclass(frozen=True)
class Assignment:
    data: str
    model_from: str
    ckpt_to: str
    network: str = ""  # compose's what-if: the network this assignment's job runs on

    @property
    def label(self) -> str:
        """Short, as verify's rows and records name an assignment."""
        return f"data={self.data},model={self.model_from},ckpt={self.ckpt_to}"

    def describe(self) -> str:
        return f"{self.network}: data {self.data}, model from {self.model_from}, checkpoints to {self.ckpt_to}"

    def tiers(self) -> set[str]:
        return {self.data, self.model_from, self.ckpt_to}

    def as_dict(self) -> dict[str, Any]:
        """As compose's record keeps a configuration."""
        return {"network": self.network, "data": self.data, "model_from": self.model_from, "ckpt_to": self.ckpt_to}
