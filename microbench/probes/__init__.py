"""One module per probe, each behind the contract in microbench.core.probe."""
