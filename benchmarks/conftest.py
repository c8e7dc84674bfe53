# The installed package registers this fixture as a pytest plugin; importing it here keeps the
# benchmarks runnable from a checkout that was never pip-installed.
from microbench.accept.pytest_plugin import probe_benchmark  # noqa: F401
