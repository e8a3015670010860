"""Record expert streams (what every rule of ``migrator-hedge`` earns per interval) for training.

Each episode of each listed scenario becomes one file ``OUT/NAME-seedN.pkl``
(:class:`rlsched.agents.experts.ExpertStreams`); files already there are kept, so an
interrupted run resumes. A scenario is a bundled name or a YAML path, optionally followed by
``@TENANT=TRACE[:SCALE[:WARP]]`` trace overrides (as ``rlsched eval --trace``).

    .venv/bin/python scripts/record_expert_streams.py --out runs/hedge-ppo/streams \\
        --scenarios default train-deploy "default@resnet=configs/traces/azure_llm_conv_timestamps.csv:90" \\
        --seeds 100 101 102 103
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from rlsched.agents.experts import record_streams, scenario_of, stream_name
from rlsched.envs.gpushare import GpuShareEnv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder of the stream files")
    parser.add_argument("--scenarios", nargs="+", required=True, help="SCENARIO[@TENANT=TRACE[:SCALE[:WARP]]...]")
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--calibration-samples", type=int, default=24, help="simulated switch costs per episode")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(spec, seed) for spec in args.scenarios for seed in args.seeds]
    scenarios = {spec: scenario_of(spec, "--scenarios") for spec in args.scenarios}  # bad input fails before any work
    for spec, seed in tqdm(jobs, desc="episodes", unit="episode"):
        path = args.out / f"{stream_name(spec, seed)}.pkl"
        if path.exists():
            continue
        env = GpuShareEnv(scenarios[spec])
        streams = record_streams(env, seed, f"{spec} seed {seed}", args.calibration_samples)
        streams.save(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
