"""In-process transport: every peer lives in this process, messages are handed over in memory."""

from p2pfl.comm.transport import Placement, Transport


class LocalTransport(Transport):
    def __init__(self, peers: int, extra_on_root: int = 0, timeout: float = 600.0):
        super().__init__(Placement(peers, 1, extra_on_root), timeout)
