"""The whole job: a timeline of model load, steps with their data stall, checkpoints and drains
(timeline.py); its inputs per storage assignment (inputs.py); every assignment ranked (whatif.py);
what compose prints and keeps (report.py)."""
