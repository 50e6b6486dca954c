"""``python -m onnxtrain.demo [--quick] [-o DIR]``."""

from onnxtrain.demo.run import main

raise SystemExit(main())
