"""The launch tools: sweeps over presets, experiment tables, figures, cluster scripts (python -m launch.sweep)."""
