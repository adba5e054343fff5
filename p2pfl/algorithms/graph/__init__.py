"""Algorithms on a graph of peers: each peer exchanges with its neighbours."""
