"""Where the model directory lives and how its shards are read back: a local directory (any
mount: `from_pretrained` on a path) or an S3 prefix (the shards as objects, fetched whole with
ranged parallel GETs, as object-store loaders fetch a checkpoint before parsing it).

Both give the probe the same three things: the raw bytes of every shard in order (`raw_read`),
every shard as tensors (`shards`), and dropping the shards' cached pages (`drop_cache`; on S3
the embedded server's data files; a remote server's cache is out of reach and said so).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...targets.workdir import drop_pages
from ..storage.s3_parts import part_plan
from . import model_dir as md

# Ranged GETs (and multipart PUT parts) of 8 MiB, 8 at a time: `aws s3 cp`'s defaults.
PART_BYTES = 8 << 20
CONCURRENCY = 8


def upload(client: Any, bucket: str, key: str, body: bytes) -> None:
    """One object: a single PUT up to a part, else a multipart upload of PART_BYTES parts, CONCURRENCY
    at a time (a shard of 5 GB is over S3's single-PUT limit)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(body) <= PART_BYTES:
        client.put_object(Bucket=bucket, Key=key, Body=body)
        return
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    view = memoryview(body)

    def put(item: tuple[int, tuple[int, int]]) -> dict[str, Any]:
        number, (off, n) = item
        got = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                 Body=bytes(view[off:off + n]))
        return {"PartNumber": number, "ETag": got["ETag"]}

    try:
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            done = list(pool.map(put, enumerate(part_plan(len(body), PART_BYTES), start=1)))
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done})
    except BaseException:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def fetch(client: Any, bucket: str, key: str, keep: bool = True) -> tuple[int, bytearray | None]:
    """One object fetched whole with ranged GETs, CONCURRENCY at a time, into one buffer (or, with
    keep=False, read and dropped part by part): (bytes, the buffer)."""
    from concurrent.futures import ThreadPoolExecutor

    size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    buf = bytearray(size) if keep else None

    def get(part: tuple[int, int]) -> int:
        off, n = part
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={off}-{off + n - 1}")["Body"]
        got = 0
        while got < n:
            chunk = body.read(min(1 << 20, n - got))
            if not chunk:
                break
            if buf is not None:
                buf[off + got:off + got + len(chunk)] = chunk
            got += len(chunk)
        if got != n:
            raise OSError(f"s3://{bucket}/{key}: range {off}+{n} returned {got} bytes")
        return got

    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        total = sum(pool.map(get, part_plan(size, PART_BYTES)))
    return total, buf


@dataclass
class LocalModel:
    layout: md.Layout
    root: str
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        return [os.path.join(self.root, self.layout.shard_name(k)) for k in range(self.layout.shards)]

    def write(self, torch: Any) -> None:
        os.mkdir(self.root)
        md.write(torch, self.layout, self.root)

    def raw_read(self) -> int:
        return md.raw_read(self.paths)

    def shards(self) -> Iterator[dict[str, Any]]:
        from safetensors.torch import load_file

        for path in self.paths:   # from_pretrained's loop: one shard after another
            yield load_file(path)

    def drop_cache(self) -> None:
        drop_pages(self.paths)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class S3Model:
    layout: md.Layout
    target: Any                     # targets.s3client.Target
    bucket: str
    prefix: str
    server_root: str | None         # the embedded server's data directory, for the cache drop
    facts: dict[str, Any] = field(default_factory=dict)
    _client: Any = None

    @property
    def keys(self) -> list[str]:
        return [f"{self.prefix}/{self.layout.shard_name(k)}" for k in range(self.layout.shards)]

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def client(self) -> Any:
        if self._client is None:
            self._client = self.target.client(pool=CONCURRENCY + 2)
        return self._client

    def write(self, torch: Any) -> None:
        """Every shard serialized in memory (one at a time) and uploaded (multipart above 8 MiB),
        then the index; the embedded server's files synced so their pages can be dropped."""
        from safetensors.torch import save

        from ...targets.s3client import preflight

        preflight(self.target, self.bucket)
        dtype = getattr(torch, self.layout.dtype)
        weight_map = {}
        for k, key in enumerate(self.keys):
            state = {t.name: md.pattern(torch, self.layout.tensors.index(t), t, dtype) for t in self.layout.in_shard(k)}
            weight_map.update({name: self.layout.shard_name(k) for name in state})
            body = save(state, metadata={"format": "pt"})
            del state
            upload(self.client(), self.bucket, key, body)
            del body
        index = {"metadata": {"total_size": self.layout.total_bytes}, "weight_map": weight_map}
        self.client().put_object(Bucket=self.bucket, Key=f"{self.prefix}/{md.INDEX}",
                                 Body=json.dumps(index, indent=2).encode())
        os.sync()

    def raw_read(self) -> int:
        """Every shard fetched with the same ranged GETs, nothing kept or parsed."""
        return sum(fetch(self.client(), self.bucket, key, keep=False)[0] for key in self.keys)

    def shards(self) -> Iterator[dict[str, Any]]:
        from safetensors.torch import load

        for key in self.keys:
            _, buf = fetch(self.client(), self.bucket, key)
            assert buf is not None   # fetched with keep=True
            yield load(bytes(buf))   # safetensors parses bytes: the copy is the loader's too
            del buf

    @property
    def cache_paths(self) -> list[str]:
        if not self.server_root:
            return []
        return [os.path.join(self.server_root, self.bucket, key) for key in self.keys]

    def drop_cache(self) -> None:
        drop_pages(self.cache_paths)

    def remove(self) -> None:
        from ...targets.s3client import delete_prefix

        try:
            delete_prefix(self.client(), self.bucket, self.prefix + "/")
        except Exception:   # best effort: the run's result stands; a leftover prefix is named in the record
            pass
