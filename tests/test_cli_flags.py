"""Every command shows the flags and defaults it showed before the probes' flags moved into
their Configs (tests/data/cli_flags_before_house.json, taken from main's own parser at 44bd48b
with `flags_shown` below): the house moved code, not the command line."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from microbench.cli import build_parser

BEFORE = Path(__file__).parent / "data" / "cli_flags_before_house.json"


def flags_shown(parser: argparse.ArgumentParser, words: list[str] | None = None,
                out: dict[str, dict[str, str | None]] | None = None) -> dict[str, dict[str, str | None]]:
    """{command: {flag spellings: the default its --help states, or argparse's own default}}."""
    words, out = words or [], {} if out is None else out
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags_shown(sub, words + [name], out)
    if words:
        flags: dict[str, str | None] = {}
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            help_text = " ".join((action.help or "").split())
            found = re.search(r"\(default:? ([^()]*(?:\([^()]*\)[^()]*)*)\)", help_text)
            shown = found.group(1).strip() if found else None
            if shown is None and action.default not in (None, argparse.SUPPRESS) and not isinstance(action.default, bool):
                shown = str(action.default)
            flags[" ".join(action.option_strings)] = shown
        out[" ".join(words)] = flags
    return out


# Defaults changed on purpose since the house move, each with its reason (anything else is drift).
CHANGED_ON_PURPOSE = {
    ("verify fsdp", "--ckpt-reps"): ("5", "9", "issue 25: a 60 MB cold read on a shared VM is bimodal (about 21 or "
                                     "95 ms); a median of 5 flipped between the modes, of 9 it holds"),
    ("storage s3", "--timeout"): ("10", "60", "it bounds a whole request now (a trickling endpoint held one "
                                  "for ever), not the connect; 60 s was the per-read timeout before"),
    ("compose", "--mfu"): ("0.4", "0.4 where --gpu has no kernel table; h100 and a100 price each kernel at its "
                                  "table's rate", "issue 33: a GPU with a kernel table prices compute per kernel"),
    ("compose", "--activation-checkpointing"): (None, "none", "issue 33: a mode (none, full, blocks:F, ops) instead "
                                                "of a switch; the bare flag still means full"),
    ("report", "--out"): (None, "a new results/report-<time>.html", "required before; a report without --out "
                          "goes where records go, under a new name, never overwriting one"),
}


# compose's and verify's flags moved into sections (compose/inputs/sections.py, verify/options.py
# and each verify command's options.py), whose --help states every default: a flag that stated
# none before now says what applies when it is not given (a repeatable one: "none", where
# argparse's empty list showed). No value changed.
STATED_SINCE = {
    ("compose", "--allow-partial"): "off",
    ("compose", "--no-reshard-after-forward"): "off",
    ("compose", "--calibration"): "none", ("compose", "--csv"): "none",
    ("compose", "--compute"): "none: --gpu x --mfu or --tflops",
    ("compose", "--gpu"): "none: give --tflops or --compute", ("compose", "--layers"): "none: the model's shapes",
    ("compose", "--params"): "none: the model's shapes", ("compose", "--model-config"): "none: --model's preset",
    ("compose", "--mtbf-hours"): "none: no Young/Daly interval", ("compose", "--tflops"): "none: --gpu x --mfu",
    ("compose", "--nccl"): "none", ("compose", "--storage"): "none", ("compose", "--tier"): "none",
    ("verify fsdp", "--calibrate-only"): "off",
    ("verify fsdp", "--calibration"): "none: calibrate in this run",
    ("verify fsdp", "--hidden"): "the preset's",
    ("verify fsdp", "--json"): "a new file in --results-dir",
    ("verify fsdp", "--lab"): "none: local ranks on loopback",
    ("verify fsdp", "--layers"): "the preset's",
    ("verify fsdp", "--link-profiles"): "none: the links as they are",
    ("verify fsdp", "--matrix"): "off",
}


def test_every_command_keeps_its_flags_and_defaults():
    """Every flag of main's commands is still there with the default it showed; flags and
    commands added since (new probes, new composer inputs) are not compared."""
    before = json.loads(BEFORE.read_text())
    now = flags_shown(build_parser())
    changed = {command: {flag: {"before": shown, "now": now.get(command, {}).get(flag, "(missing)")}
                         for flag, shown in flags.items() if now.get(command, {}).get(flag, "(missing)") != shown}
               for command, flags in before.items()}
    for (command, flag), (was, now_shown, _why) in CHANGED_ON_PURPOSE.items():
        assert changed.get(command, {}).pop(flag, None) == {"before": was, "now": now_shown}, (command, flag)
    for (command, flag), stated in STATED_SINCE.items():
        assert changed.get(command, {}).pop(flag, None) == {"before": before[command][flag], "now": stated}, flag
        assert before[command][flag] in (None, "[]"), flag
    assert {command: diff for command, diff in changed.items() if diff} == {}


def test_every_verify_flag_states_its_default():
    """verify fsdp's and verify job's --help: every flag with its default."""
    now = flags_shown(build_parser())
    for command in ("verify fsdp", "verify job"):
        silent = [flag for flag, shown in now[command].items() if shown is None and flag != "--phase-spec"]
        assert silent == [], command

