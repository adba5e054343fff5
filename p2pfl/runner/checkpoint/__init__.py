"""Checkpointing in its parts, so that --resume continues a run exactly:

- files.py: the file format: each rank's file of a state in two alternating slots, atomic writes,
  latest.json, and reading the newest readable one back (what its parts must hold, checked);
- restore.py: a snapshot checked against the run as configured, then put back into the run;
- policy.py: what the run's state is (capture) and when it is saved: every N rounds, every
  CHECKPOINT_SECONDS, at a stop, and what a stop at once saves from memory.

What stops a run (signals, the flag the long loops read, the stop request) is p2pfl.stopping's.
"""
