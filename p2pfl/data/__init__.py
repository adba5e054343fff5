"""Datasets and their partition over peers."""
from p2pfl.data.partition import partition, summary
from p2pfl.data.sources import Dataset, load_dataset

__all__ = ["Dataset", "load_dataset", "partition", "summary"]
