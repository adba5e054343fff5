"""Settings declared once (default, help, check), so that flags, TOML keys, checks and the docs' tables are
derived from the declarations. The lowest layer above the shared pieces: the algorithms declare their
own settings with it.

- fields.py: how a setting is declared (option) and the checks settings share;
- run_config.py: the run's own settings (RunConfig).
"""
