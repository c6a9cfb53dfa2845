"""Shared pytest setup: the repo root on sys.path, so tests import grpo, policies, train ... directly."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The test models are tiny and the machine's 2 cores are shared with other jobs: one intra-op thread avoids
# oversubscription (with 2 threads under load, a tiny forward/backward can take 20x longer).
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # tests that do not need torch still run
    pass
