"""`microbench mount up|down|status`: a bucket mounted with rclone, direct or cached."""

from __future__ import annotations

import argparse
import json

from ..core.units import format_bytes_human, parse_duration_s, parse_timeout
from ..targets import mount as mountmod


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mount", help="mount a bucket with rclone (direct or cached) for the storage probes",
                       description="Mount an S3 bucket at a path with `rclone mount`, as training jobs do, so "
                                   "storage posix and checkpoint can write through it. Needs FUSE (fuse3).")
    msub = p.add_subparsers(dest="mount_command", metavar="ACTION", parser_class=type(p))
    msub.required = True
    up = msub.add_parser("up", help="mount a bucket; the mount (and the embedded S3 server) outlive the command")
    up.add_argument("--name", default="m", help="mount name, one mount per name (default m)")
    up.add_argument("--mode", default="cached", help="direct (no write cache: writes stream to the bucket) or "
                    "cached (rclone's full VFS cache on --cache-dir, uploaded after close) (default cached)")
    up.add_argument("--path", default=None, help="empty directory to mount at (default: one in the mount's state "
                    "directory, printed)")
    up.add_argument("--cache-dir", default=None, help="cached: local directory for the cache (default: the state "
                    "directory); a subdirectory is made there and removed by `down`")
    up.add_argument("--write-back", default="5s", help="cached: delay after close before the upload starts "
                    "(default 5s)")
    up.add_argument("--endpoint", default=None, help="S3 endpoint URL (credentials from the standard AWS "
                    "environment/profile); default: start an embedded server (rclone serve s3) that lives "
                    "until `down`")
    up.add_argument("--bucket", default=None, help="bucket to mount (default microbench; with --endpoint: an "
                    "existing bucket)")
    up.add_argument("--timeout", default="20", help="seconds to wait for the mount (default 20)")
    down = msub.add_parser("down", help="unmount, stop what up started, remove the cache (and a crash's leftovers)")
    down.add_argument("--name", default="m", help="mount name (default m)")
    down.add_argument("--all", action="store_true", help="every microbench mount on this machine")
    status = msub.add_parser("status", help="show microbench mounts")
    status.add_argument("--name", default=None, help="only this mount (default: all)")
    status.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.mount_command == "up":
        req = mountmod.MountRequest(
            name=args.name, mode=args.mode, path=args.path, cache_dir=args.cache_dir,
            write_back_s=parse_duration_s(args.write_back, what="--write-back", example="5s"),
            endpoint=args.endpoint, bucket=args.bucket,
            timeout_s=parse_timeout(args.timeout, example="20"))
        state, leftovers = mountmod.up(req)
        if leftovers:
            print(f"# removed leftovers of an earlier run: {', '.join(leftovers)}")
        cache = (f", cache {state.cache_dir}, write-back {state.write_back_s:g} s" if state.mode == "cached" else "")
        print(f"mount {state.name!r} up: {state.path} ({state.mode}{cache}) on {state.backing()}; "
              f"rclone {state.rclone_version}")
        print(state.path)
        return 0
    if args.mount_command == "down":
        names = mountmod.names() if args.all else [args.name]
        removed = [item for name in names for item in mountmod.down(name)]
        print("removed: " + ", ".join(removed) if removed else
              f"nothing to remove: no {'microbench mount' if args.all else f'mount {args.name!r}'} on this machine")
        return 0
    rows = mountmod.status(args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no microbench mount is up")
    for row in rows if not args.json else ():
        if "path" not in row:
            print(f"{row['name']}: {row['state']}")
            continue
        cache = (
            f", cache {format_bytes_human(row.get('cache_bytes', 0))} in {row['cache_dir']}" if row["cache_dir"] else ""
        )
        print(f"{row['name']}: {row['state']}, {row['path']} ({row['mode']}{cache}) on {row['backing_store']}, "
              f"rclone {row['rclone_version']} pid {row['rclone_pid']}")
    return 0
