"""Datasets and their partition over peers."""
from p2pfl.data.partition import partition, summary
from p2pfl.data.sources import DATASETS, DataRequest, Dataset, canonical_dataset, load_dataset

__all__ = ["DATASETS", "DataRequest", "Dataset", "canonical_dataset", "load_dataset", "partition", "summary"]
