"""The base every other package stands on: the probe contract, the registry, errors, units,
statistics, fits and progress. Imports nothing else of microbench."""
