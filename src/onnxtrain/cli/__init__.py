"""The `onnxtrain` command: import, generate, train, eval, export, info, data, ops and demo (see `onnxtrain --help`)."""
