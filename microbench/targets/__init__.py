"""Where probes read and write: work directories, checkpoint targets, the S3 client and
embedded server, the native core and its pure-Python fallbacks."""
