"""Train a PPO policy: a thin wrapper of ``rlsched train`` (same arguments).

    .venv/bin/python scripts/train.py --config configs/train/ppo_default.yaml --out runs/NAME [--resume]
"""

import sys

from rlsched.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
