"""``python -m onnxtrain.federated simulate --clients 3 --rounds 3``"""

import sys

from onnxtrain.federated.cli import main

sys.exit(main())
