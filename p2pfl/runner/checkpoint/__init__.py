"""Checkpointing in its parts, so that --resume continues a run exactly:

- files.py: what a checkpoint holds and its files (two alternating slots, atomic writes, latest.json),
  written and read back;
- restore.py: a snapshot checked against the run as configured, then put back into the run;
- policy.py: when a run saves (every N rounds, every CHECKPOINT_SECONDS, at a stop) and what a stop at
  once saves.

What stops a run (signals, the flag the long loops read, the stop request) is p2pfl.stopping's.
"""
