"""Errors that are the user's to fix: the CLI prints them as one line and exits with status 2."""


class ConfigError(Exception):
    """Bad input (flags, config file, data files): reported without a traceback. Its one name, which a
    script catches and sees printed (p2pfl.ConfigError); p2pfl's own code raises it as UserError."""


UserError = ConfigError


class DivergenceError(Exception):
    """A peer's model became NaN/inf; the message names the round and the peers."""


class OutOfGPUMemory(Exception):
    """The run does not fit its GPU: one line naming what shrinks it (exit 2), printed by the rank that
    ran out, which then ends the job."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the run; the message says where and how to resume (exit 130 for Ctrl-C,
    143 for SIGTERM, as a shell reports a process those signals ended)."""

    def __init__(self, message: str, code: int = 130):
        super().__init__(message)
        self.code = code
