"""The storage probes: the native POSIX engine, fio, S3 and GPUDirect Storage."""
