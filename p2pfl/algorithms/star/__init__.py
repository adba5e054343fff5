"""Algorithms on a star: a server samples clients, and they exchange with it only."""
