"""The one way microbench gets matplotlib: pictures are part of the main job (matplotlib is a
main dependency), so a command asked for a picture it cannot draw fails (exit 1) instead of
skipping it, and the hint names the checkout, never a package index: on PyPI the name
`microbench` belongs to an unrelated project."""

from __future__ import annotations

from typing import Any

from .errors import RunError

REINSTALL_HINT = "reinstall from the microbench checkout: cd microbench && pip install ."


def pyplot(what: str = "a plot") -> Any:
    """matplotlib.pyplot on the headless Agg backend, or RunError saying why it cannot draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        # Every label is text: a record file named `$x^{$.json` (or a plot label) is a name, not
        # TeX; with math parsing on, matplotlib failed on it ("ValueError: x^{"). Ours use none.
        if "text.parse_math" in matplotlib.rcParams:
            matplotlib.rcParams["text.parse_math"] = False
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RunError(
            f"cannot draw {what}: matplotlib does not import ({exc}); it is a dependency of "
            f"microbench, so {REINSTALL_HINT}"
        ) from None
    return plt
