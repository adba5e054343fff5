"""p2pfl: a decentralized peer-to-peer learning simulator on a graph."""

__version__ = "0.1.0"
