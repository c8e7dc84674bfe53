"""The fleet's S3 source refuses a bucket that does not exist with an example of its own
command's form (s3://BUCKET/PREFIX), not the S3 probes' `--bucket`, which fleet does not have."""

from __future__ import annotations

import pytest

from microbench.accept.fleet import s3source
from microbench.core.errors import UsageError


def test_a_missing_bucket_is_refused_with_the_fleet_s_own_example(monkeypatch):
    exceptions = pytest.importorskip("botocore.exceptions")
    from microbench.targets.s3client import Target

    class NoBucket:
        def list_objects_v2(self, **kwargs):
            raise exceptions.ClientError({"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "ListObjectsV2")

    monkeypatch.setattr(s3source, "_client", lambda endpoint: (Target("http://127.0.0.1:9"), NoBucket()))
    with pytest.raises(UsageError) as refused:
        list(s3source.objects("s3://no-such-bucket/run-1", "http://127.0.0.1:9"))
    line = str(refused.value)
    assert "bucket 'no-such-bucket' does not exist at 'http://127.0.0.1:9'" in line
    assert "--bucket" not in line and "e.g. s3://" in line
