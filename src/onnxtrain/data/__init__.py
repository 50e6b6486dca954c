"""Datasets for ``onnxtrain train``: one .npz file with arrays ``x`` and ``y`` (see :mod:`onnxtrain.data.dataset`),
readers that convert .npy, .npz, CSV and image folders into it, and the check that a dataset fits a model."""

from onnxtrain.data.convert import read_any, read_csv, read_image_folder, read_npy, read_npz, reshape
from onnxtrain.data.dataset import Dataset, DatasetError, load_dataset, save_dataset
from onnxtrain.data.match import DataSpec, data_spec, fit_dataset

__all__ = ["Dataset", "DatasetError", "load_dataset", "save_dataset", "read_any", "read_npz", "read_npy", "read_csv",
           "read_image_folder", "reshape", "DataSpec", "data_spec", "fit_dataset"]
