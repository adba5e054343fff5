"""Measuring a run: a round's facts gathered once, each metric declared once, the models scored, and
the figures and TensorBoard views drawn from the rows. Below the algorithms, which declare their own
metrics and draw their own figures here.

- metrics.py: every metric declared once (keys, meaning, unit, how rank 0 computes it);
- facts.py: what a round leaves to measure, as plain values per rank and for the round;
- scoring.py: the peers' models on the test set, each on its own subset;
- graph_diagnostics.py: consensus distance, the round graph's spectral gap, traffic spread over edges;
- final_averaging.py: NTK-DFL's final averaging with client selection;
- figures.py: the figures a run draws into its folder;
- tensorboard_log.py: the rows as TensorBoard scalars (--tensorboard).
"""
