"""Datasets and their partition over peers."""

from p2pfl.data.partition import partition, summary
from p2pfl.data.partition_file import read_partition_file
from p2pfl.data.sources import DATASETS, DataRequest, Dataset, canonical_dataset, dataset_spec, load_dataset

__all__ = [
    "DATASETS",
    "DataRequest",
    "Dataset",
    "canonical_dataset",
    "dataset_spec",
    "load_dataset",
    "partition",
    "read_partition_file",
    "summary",
]
