"""core/sections.py: a command's flags declared once in section dataclasses, the argparse groups
made from them, argv parsed back into the typed sections (misuse refused as UsageError before
any work) and the values a record keeps."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from microbench.core import options, sections
from microbench.core.errors import UsageError


@dataclass
class Shape:
    TITLE: ClassVar[str] = "shape"
    DESCRIPTION: ClassVar[str] = "what is trained"
    seq_len: int = options.option(4096, help="tokens per sequence", parse=options.positive_int)
    size_bytes: int = options.option(1 << 20, help="bytes per sample", parse=options.nbytes)
    dtype: str = options.option("bfloat16", help="what moves", choices=("bfloat16", "float32"))
    gpu: str | None = options.option(None, help="accelerator", shown="none: --tflops instead")
    tier: list[str] = options.option([], help="a tier (repeatable)", repeat=True, metavar="NAME=GB/S")
    rates: list[float] = options.option([], help="rates (repeatable)", repeat=True, parse=options.positive)
    fast: bool = options.option(False, help="go fast", switch=True, shown="off")
    quiet: bool = options.option(False, help="say less", switch=True)

    def check(self) -> None:
        if self.fast and self.gpu is None:
            raise UsageError("--fast needs --gpu, e.g. --gpu h100 --fast")


@dataclass
class Output:
    TITLE: ClassVar[str] = "output"
    json: str | None = options.option(None, help="record path", record=False, metavar="PATH")


@dataclass
class Options:
    shape: Shape = field(default_factory=Shape)
    output: Output = field(default_factory=Output)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    sections.add_sections(p, Options)
    return p


def parse(*argv: str) -> Options:
    return sections.parse_sections(Options, parser().parse_args(list(argv)))


def test_defaults_when_nothing_is_given():
    opts = parse()
    assert opts.shape == Shape() and opts.output.json is None
    assert opts.shape.tier == [] and opts.shape.rates == []


def test_every_flag_is_parsed_once_into_its_type():
    opts = parse("--seq-len", "2048", "--size-bytes", "4K", "--dtype", "float32", "--gpu", "h100", "--tier", "a=1",
                 "--tier", "b=2", "--rates", "1.5", "--rates", "3", "--fast", "--json", "x.json")
    assert opts.shape == Shape(2048, 4096, "float32", "h100", ["a=1", "b=2"], [1.5, 3.0], True, False)
    assert opts.output.json == "x.json"


@pytest.mark.parametrize("argv, message", [
    (("--seq-len", "0"), "invalid --seq-len '0': must be at least 1"),
    (("--seq-len", "1e3"), "invalid --seq-len '1e3': expected a positive whole number"),
    (("--size-bytes", "lots"), "invalid --size-bytes 'lots'"),
    (("--rates", "1", "--rates", "nan"), "invalid --rates 'nan': expected a finite number"),
    (("--fast",), "--fast needs --gpu"),
])
def test_misuse_is_a_usage_error_quoting_the_flag_and_value(argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse(*argv)


def test_help_has_one_group_per_section_and_states_each_default():
    text = " ".join(parser().format_help().split())
    assert "shape: what is trained" in text and "output:" in text
    assert "tokens per sequence (default 4096)" in text
    assert "bytes per sample (default 1M)" in text
    assert "accelerator (default none: --tflops instead)" in text
    assert "go fast (default off)" in text and "say less" in text and "say less (default" not in text


def test_a_percent_in_help_is_shown_not_formatted():
    @dataclass
    class Ckpt:
        overhead: str = options.option("5%", help="share of time a save may cost")

    p = argparse.ArgumentParser(prog="t")
    sections.add_section(p, Ckpt)
    assert "(default 5%)" in " ".join(p.format_help().split())


def test_resolved_is_what_the_record_keeps_per_section():
    opts = parse("--seq-len", "128", "--json", "x.json")
    got = sections.resolved(opts)
    assert got["shape"]["seq_len"] == 128 and got["shape"]["gpu"] is None
    assert got["output"] == {}   # --json is where to write, not what was predicted
