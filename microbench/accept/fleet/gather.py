"""Every node's records, from wherever the fleet wrote them: directory trees, globs, S3 prefixes.

A node is the host name its records carry (environment.hostname). Probe records are node
records: `microbench suite --results-dir ROOT/NODE` leaves ROOT/NODE/suite-TIME/STEP.json, and
any layout works since the record names its node. Records that span nodes are pair sources:
`hunt` (every host pair), a `link` between two hosts. Everything else is set aside and listed:
compose records, earlier fleet records, JSON that is no record. A file that claims to be a
record (it has a schema_version) and cannot be read is refused: an unknown schema version means
a newer microbench wrote it, and reading it wrongly would be worse than not reading it.

Records are yielded one at a time, so a thousand nodes' records never sit in memory at once.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...core import registry
from ...core.errors import UsageError
from ...core.jsonfile import MAX_JSON_BYTES, read_text
from ...results.schema import check_record, check_rows, upgrade
from . import s3source

EXAMPLE = "e.g. microbench fleet results/fleet-1 (each node ran `microbench suite --results-dir results/fleet-1/NODE`)"
PAIR_KINDS = ("hunt",)
SET_ASIDE_KINDS = ("fleet", "compose", "verify", "calibration")


@dataclass
class Document:
    location: str             # a path, or s3://bucket/key
    record: dict[str, Any]

    @property
    def name(self) -> str:
        return self.location.rsplit("/", 1)[-1]


@dataclass
class Inventory:
    """What the sources held, apart from the node records themselves."""
    sources: list[str]
    files: int = 0
    node_records: int = 0
    pairs: list[str] = field(default_factory=list)        # locations of records between nodes
    set_aside: list[str] = field(default_factory=list)      # "where: why"


def read_hosts(path: str) -> list[str]:
    """The nodes expected: one name a line; blank lines and # comments skipped."""
    text = read_text(path, what="--hosts file", expected="node names, one a line, e.g. hosts.txt with n001")
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [n for n in names if n]
    if not names:
        raise UsageError(f"--hosts file {path!r} names no node; expected one name a line, e.g. n001")
    seen: set[str] = set()
    for name in names:
        if len(name.split()) != 1:
            raise UsageError(
                f"--hosts file {path!r}: {name!r} is not one host name; expected one name a line, e.g. n001"
            )
        if name in seen:
            raise UsageError(f"--hosts file {path!r} names {name!r} twice; expected each node once")
        seen.add(name)
    return names


def is_s3(source: str) -> bool:
    return str(source).startswith("s3://")


def check_sources(sources: list[str]) -> None:
    """Refuse, before reading anything, a source that cannot be a place of records."""
    if not sources:
        raise UsageError(f"no records given: expected directories, globs or s3:// prefixes, {EXAMPLE}")
    for source in sources:
        if is_s3(source):
            s3source.split_url(source)
        elif not glob.has_magic(source) and not os.path.exists(source):
            raise UsageError(f"{source!r} does not exist; expected a directory of suite records, a glob or an "
                             f"s3://bucket/prefix, {EXAMPLE}")


def documents(sources: list[str], endpoint: str | None, inventory: Inventory) -> Iterator[Document]:
    """Every record under the sources, checked; what is no record goes to inventory.set_aside."""
    for source in sources:
        found = 0
        for location, read in _files(source, endpoint):
            inventory.files += 1
            found += 1
            document = parse(location, read())
            if document is None:
                inventory.set_aside.append(f"{location}: not a microbench record")
            elif document.record.get("kind") in SET_ASIDE_KINDS:
                inventory.set_aside.append(f"{location}: a {document.record.get('kind')} record")
            else:
                yield document
        if not found:
            where = "prefix" if is_s3(source) else "glob" if glob.has_magic(source) else "directory"
            raise UsageError(f"no records (*.json) under {source!r} (an empty {where}); expected suite records, "
                             f"one directory per node, {EXAMPLE}")


def _files(source: str, endpoint: str | None) -> Iterator[tuple[str, Any]]:
    """(location, a function that reads its bytes) for every *.json under one source."""
    if is_s3(source):
        yield from s3source.objects(source, endpoint)
        return
    roots = sorted(glob.glob(source, recursive=True)) if glob.has_magic(source) else [source]
    for root in roots:
        if os.path.isdir(root):
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                for name in sorted(names):
                    if name.endswith(".json"):
                        path = os.path.join(folder, name)
                        yield path, _reader(path)
        elif root.endswith(".json"):
            yield root, _reader(root)


def _reader(path: str) -> Any:
    def read() -> bytes | None:
        try:
            if os.path.getsize(path) > MAX_JSON_BYTES:
                return None
            return Path(path).read_bytes()
        except OSError:
            return None
    return read


def parse(location: str, data: bytes | None) -> Document | None:
    """The record in `data`, upgraded to the current schema; None for what is no record at all
    (not JSON, no schema_version); UsageError for a record this version cannot read."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or "schema_version" not in value:
        return None
    record = upgrade(value)
    try:
        # The envelope in full; the rows as objects only. The fleet checks every number it takes
        # from a row itself (metrics.py), and the row schema's check of every field of 11,000
        # records was a fifth of the time a thousand nodes took.
        check_record({**record, "rows": []} if isinstance(record.get("rows"), list) else record)
        check_rows({"kind": ""}, record["rows"])
    except ValueError as exc:
        raise UsageError(f"results file {location!r} is not a microbench record this version reads: {exc}") from None
    return Document(location, record)


def step_of(document: Document) -> str:
    """The suite step a record stands for: its file's name (checkpoint.json and checkpoint-s3.json
    are two steps of one probe), else its probe's name."""
    found = registry.suite_step(Path(document.name).stem)
    if found is not None:
        return found[1].name
    spec = registry.for_record(document.record)
    return spec.name if spec is not None else str(document.record.get("kind"))


def node_of(document: Document) -> str | None:
    env = document.record.get("environment")
    name = env.get("hostname") if isinstance(env, dict) else None
    return str(name) if name else None


def is_pair_source(record: dict[str, Any]) -> bool:
    """Records measured between nodes: hunt's pairs, a link between two different hosts, a
    collective whose --groups topology spans several nodes."""
    if record.get("kind") in PAIR_KINDS:
        return True
    topology = (record.get("summary") or {}).get("topology")
    if record.get("kind") == "nccl" and isinstance(topology, dict) and (topology.get("nodes") or 0) > 1:
        return True
    hosts = ((record.get("config") or {}).get("probe") or {}).get("hosts")
    return record.get("kind") == "link" and isinstance(hosts, list) and len(set(map(str, hosts))) == 2
