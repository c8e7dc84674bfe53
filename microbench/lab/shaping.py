"""The tc side of a lab's links, pure (commands built, tc's output read): every host's egress
rate and delay (tbf, netem), and one host or one link shaped differently from the rest: the
faults `hunt` finds. lab/namespaces.py runs these commands.

`--host-link h2=100mbit` gives host 2's egress its own rate (a slow NIC, a bad cable on that
host). `--pair-link h0-h1=100mbit` slows only the path between hosts 0 and 1, both ways, while
each keeps its full rate to everyone else (a bad switch port pairing, a flapping route): each
end gets an HTB root with a default class at its host rate and one class at the link rate,
chosen by a u32 filter on the peer's address. HTB rather than prio + tbf because HTB is the
classful qdisc kernels without the optional schedulers still have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.errors import UsageError

IFNAME = "lab0"
_HOST_RE = re.compile(r"^\s*h(\d+)\s*=\s*(\S+)\s*$")
_PAIR_RE = re.compile(r"^\s*h(\d+)\s*-\s*h(\d+)\s*=\s*(\S+)\s*$")
# An HTB class without a rate limit still needs a rate: far above anything a veth carries.
_UNLIMITED_BPS = 100 * 10**9
# A token bucket at least this many seconds of the rate deep: the kernel refills it once per
# timer tick (HZ 100-1000), and a bucket shallower than one tick caps a link below its rate.
_BURST_S = 0.01
_QUEUE_S = 0.02
# That bucket is also credit: a link idle for _BURST_S sends its next burst bytes at the veth's
# own speed (tens of Gbit/s), not at the rate. A NIC has no such credit, and a training step
# idles its links during compute, so on a 1gbit lab every collective issued after compute ran
# faster than the same collective back to back, where a probe times it, and verify's step
# predictions came out high (docs/BENCHMARKS.md has the figures). tbf's peak rate caps how fast
# the bucket may drain: a tenth above the rate leaves the link headroom to catch up after a late
# wakeup, and a peak bucket of a millisecond of it (at least one 64 KiB GSO packet, so tbf need
# not split them) is what one wakeup may send; at half that, the kernel's wakeups come too late
# under load and the link falls to half its rate.
_PEAK_OVER_RATE = 1.1
_PEAK_BUCKET_S = 0.001
_GSO_BYTES = 64 * 1024


@dataclass
class Shaping:
    """What each host's egress should be: a base rate, per-host overrides, per-link overrides."""
    base_bps: int | None
    hosts: dict[int, int | None] = field(default_factory=dict)
    pairs: dict[tuple[int, int], int | None] = field(default_factory=dict)

    def host_rate(self, index: int) -> int | None:
        return self.hosts.get(index, self.base_bps)

    def links_from(self, index: int) -> list[tuple[int, int | None]]:
        """(peer, rate) for every shaped link this host is an end of."""
        out = []
        for (a, b), rate in sorted(self.pairs.items()):
            if index in (a, b):
                out.append((b if index == a else a, rate))
        return out


def _rate(text: str, what: str, example: str) -> int | None:
    from ..core.units import parse_link_rate

    try:
        return parse_link_rate(text)
    except UsageError:
        raise UsageError(
            f"invalid {what} rate {text!r}: expected a rate in bit/kbit/mbit/gbit, e.g. {what} {example}"
        ) from None


def parse_host_links(items: list[str], hosts: int) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for item in (part for text in items for part in str(text).split(",") if part.strip()):
        match = _HOST_RE.match(item)
        if not match:
            raise UsageError(f"invalid --host-link {item!r}: expected hINDEX=RATE, e.g. --host-link h2=100mbit")
        index = int(match.group(1))
        if not 0 <= index < hosts:
            raise UsageError(
                f"invalid --host-link {item!r}: the lab has hosts h0 to h{hosts - 1}, e.g. --host-link h1=100mbit"
            )
        out[index] = _rate(match.group(2), "--host-link", "h2=100mbit")
    return out


def parse_pair_links(items: list[str], hosts: int) -> dict[tuple[int, int], int | None]:
    out: dict[tuple[int, int], int | None] = {}
    for item in (part for text in items for part in str(text).split(",") if part.strip()):
        match = _PAIR_RE.match(item)
        if not match:
            raise UsageError(f"invalid --pair-link {item!r}: expected hA-hB=RATE, e.g. --pair-link h0-h1=100mbit")
        a, b = int(match.group(1)), int(match.group(2))
        if a == b or not (0 <= a < hosts and 0 <= b < hosts):
            raise UsageError(f"invalid --pair-link {item!r}: expected two different hosts of h0 to h{hosts - 1}, "
                             f"e.g. --pair-link h0-h1=100mbit")
        out[(min(a, b), max(a, b))] = _rate(match.group(3), "--pair-link", "h0-h1=100mbit")
    return out


def tbf_buckets(rate_bps: int) -> tuple[int, int, int]:
    """(burst bytes, peak rate in bit/s, peak bucket bytes) of a host's tbf at this rate (pure)."""
    burst = max(256 * 1024, int(rate_bps / 8 * _BURST_S))
    peak_bps = int(rate_bps * _PEAK_OVER_RATE)
    return burst, peak_bps, max(_GSO_BYTES, int(peak_bps / 8 * _PEAK_BUCKET_S))


def shape_commands(ns: str, rate_bps: int | None, delay_ms: float) -> list[list[str]]:
    """tc commands that give one host's egress the rate and delay (pure: unit-tested)."""
    cmds = [["tc", "-n", ns, "qdisc", "del", "dev", IFNAME, "root"]]
    tbf: list[str] = []
    if rate_bps is not None:
        burst, peak_bps, peak_bucket = tbf_buckets(rate_bps)
        limit = burst + int(rate_bps / 8 * (_QUEUE_S + delay_ms / 1000))
        tbf = ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "limit", str(limit),
               "peakrate", f"{peak_bps}bit", "mtu", str(peak_bucket)]
    if delay_ms > 0:
        # netem holds the delayed packets; its queue must cover rate x delay or it drops.
        limit = max(10000, int((rate_bps or 100 * 10**9) / 8 * delay_ms / 1000 / 1500 * 2))
        cmds.append(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", "netem",
                     "delay", f"{delay_ms:g}ms", "limit", str(limit)])
        if tbf:
            cmds.append(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "parent", "1:", "handle", "2:", *tbf])
    elif tbf:
        cmds.append(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", *tbf])
    return cmds


def _htb_class(ns: str, classid: str, rate_bps: int | None) -> list[str]:
    rate = rate_bps or _UNLIMITED_BPS
    rate_Bps = rate / 8
    burst = max(256 * 1024, int(rate_Bps * 0.01))
    # quantum: bytes a class may send per round; HTB warns above 200000 and it only matters
    # for sharing between classes, which these never compete for.
    quantum = min(200_000, max(1514, int(rate_Bps / 10)))
    return [
        "tc",
        "-n",
        ns,
        "class",
        "add",
        "dev",
        IFNAME,
        "parent",
        "1:",
        "classid",
        classid,
        "htb",
        "rate",
        f"{rate}bit",
        "ceil",
        f"{rate}bit",
        "burst",
        str(burst),
        "cburst",
        str(burst),
        "quantum",
        str(quantum),
    ]


def htb_commands(ns: str, host_bps: int | None, links: list[tuple[str, int | None]]) -> list[list[str]]:
    """tc commands for a host whose egress to some peers (by address) has its own rate (pure)."""
    cmds = [["tc", "-n", ns, "qdisc", "del", "dev", IFNAME, "root"],
            ["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", "htb", "default", "2"],
            _htb_class(ns, "1:2", host_bps)]
    for i, (address, rate) in enumerate(links):
        classid = f"1:{10 + i}"
        cmds.append(_htb_class(ns, classid, rate))
        cmds.append(["tc", "-n", ns, "filter", "add", "dev", IFNAME, "parent", "1:", "protocol", "ip", "prio", "1",
                     "u32", "match", "ip", "dst", f"{address}/32", "flowid", classid])
    return cmds


def parse_htb_rate(text: str) -> int | None:
    """The default class's rate from `tc qdisc show` + `tc class show` text (None: unlimited)."""
    match = re.search(r"class htb 1:2 .*?rate (\d+(?:\.\d+)?)([KMGT]?)bit", text)
    return _bps(match.group(1), match.group(2)) if match else None


def parse_htb_links(classes: str, filters: str) -> list[tuple[str, int | None]]:
    """(peer address, rate) for every per-link class, from `tc class show` and `tc filter show`
    text: the filter says which class a peer's address goes to, the class its rate (pure)."""
    rates = {cid: _bps(num, unit) for cid, num, unit in
             re.findall(r"class htb (1:\d+) .*?rate (\d+(?:\.\d+)?)([KMGT]?)bit", classes)}
    out = []
    # tc prints a u32 filter as "... flowid 1:10 ..." then "match 0ad50002/ffffffff at 16"
    # (the destination address, in hex, at its offset in the IP header).
    for cid, hexaddr in re.findall(r"flowid (1:\d+)\b.*?match ([0-9a-f]{8})/ffffffff at 16", filters, re.S):
        address = ".".join(str(int(hexaddr[i:i + 2], 16)) for i in range(0, 8, 2))
        out.append((address, rates.get(cid)))
    return sorted(out)


def _bps(number: str, unit: str) -> int | None:
    bps = int(float(number) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[unit])
    return None if bps >= _UNLIMITED_BPS else bps


def current(base_bps: int | None, host_rates: dict[int, int | None],
            host_links: dict[int, list[tuple[int, int | None]]]) -> Shaping:
    """The Shaping that reproduces what the hosts have now: the hosts whose egress differs
    from the base rate, and every shaped link (seen from either end) (pure)."""
    hosts = {i: rate for i, rate in host_rates.items() if rate != base_bps}
    pairs = {(min(i, peer), max(i, peer)): rate for i, links in host_links.items() for peer, rate in links}
    return Shaping(base_bps, hosts, pairs)


def parse_shaping(text: str) -> tuple[int | None, float]:
    """(rate in bit/s or None, delay in ms) from `tc qdisc show` of one host (pure)."""
    if " htb " in f" {text} ":
        return parse_htb_rate(text), 0.0
    rate = re.search(r"tbf \S+ .*?rate (\d+(?:\.\d+)?)([KMGT]?)bit", text)
    delay = re.search(r"netem \S+ .*?delay (\d+(?:\.\d+)?)(us|ms|s)", text)
    bps = None
    if rate:
        bps = int(float(rate.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[rate.group(2)])
    delay_ms = 0.0
    if delay:
        delay_ms = float(delay.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[delay.group(2)]
    return bps, delay_ms
