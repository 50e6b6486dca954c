"""`python -m onnxtrain.cli`: the same as the `onnxtrain` command."""

from onnxtrain.cli.main import main

raise SystemExit(main())
