"""Cluster acceptance across a fleet (`microbench fleet`): every node's suite records gathered,
each node held against its peers, the bad ones named with the evidence and what they cost.

gather (trees, globs, S3 prefixes) -> groups (fingerprints, drift) -> metrics (samples per
node) -> stats (robust z, k from a budget, the noise rule) -> verdicts (lines, nodes, fleet-wide
findings) -> pairs (hunt's matrix to nodes and links) -> cost (the composer) -> outputs (table,
record, JUnit, lists) and html (the report's fleet section); analysis ties them, run.py is the
one call the command makes."""
