"""`verify fsdp`: real fully_shard steps predicted from probes run beside them (steps.py, paired.py,
hybrid.py), the calibration (calibrate.py), what the ranks run (phases.py), the plan, the report and
the launching side (plan.py, report.py, run.py)."""
