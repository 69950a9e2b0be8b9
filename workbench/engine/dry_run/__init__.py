"""The dry run's rank side: one process per distinct rank position, on one CPU.

A position (a pipeline stage x the shard shapes its ranks hold) is laid out by
``engine.prepare`` (the same strategies code live ranks run) under torch's fake process
group at the full world size and the position's real rank number, on fake tensors (no
memory, no data), and steps once while :class:`~.tracker.StepTracker` counts the peak and
the collectives. :mod:`.server` is the preloaded parent that forks the positions;
:mod:`workbench.notebook.dry_run` starts it and reads its report.
"""
