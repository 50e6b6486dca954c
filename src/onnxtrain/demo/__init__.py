"""``onnxtrain demo`` / ``python -m onnxtrain.demo``: on-device personalization of a digit classifier, end to end
(see :mod:`onnxtrain.demo.run`)."""
