"""Built-in workloads shipped with the package (used by ``ddp-profile demo`` and the tests)."""

import os

DEMO_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_train.py")
