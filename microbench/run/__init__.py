"""Running a probe: the sweep (warm-up, timing, statistics, records) and what a probe needs
set up before it runs and torn down after."""
