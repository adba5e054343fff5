"""The run: built from its settings, looped over its rounds, written to its folder. Above the
algorithms; below the CLI (p2pfl.run) and the public API.

- simulation.py: a run on this rank, start to end; `simulate`, the Python entry;
- configure.py: one RunConfig from defaults < TOML file < flags, checked against the algorithm and data;
- assemble.py: the run's parts built once (device, data, partition, model, transport, graph, algorithm);
- graph_schedule.py: the run's graph schedule from its settings (a family, a user's function, a file);
- loop.py: the round loop and what observes each round;
- round_row.py: a round's row from the run's context, gathered once to rank 0 (p2pfl.measure computes it);
- run_folder.py: the run folder, its lock and its files (header, edges, final.json, model.pt, plots);
- checkpoint/: checkpointing in its parts (files, restore, when to save);
- fit_checks.py: does the run fit this machine and its data, before any work;
- paths.py: paths checked before use, regular files only, what in a run folder is not a run's file;
- provenance.py: which code and machine produced a run.
"""
