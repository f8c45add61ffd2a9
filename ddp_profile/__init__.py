"""ddp-profile: measure why the GPUs of a PyTorch DDP job sit idle, and which settings fix it.

Importing this package changes nothing; the rank-side instrumentation is installed only by the
start-up hook, and only when the ``DDP_PROFILE`` environment variable is set by the harness.
"""

__version__ = "0.1.0"
