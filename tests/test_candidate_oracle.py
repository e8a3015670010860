"""scripts/candidate_oracle.py: the foresight oracle over candidate-ppo's offered slots, on tiny nodes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.agents.ppo.candidate_env import CANDIDATE_FEATURES, CANDIDATES, GLOBAL_FEATURES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "candidate_oracle.py"
DATA = ROOT / "tests" / "data"


@pytest.mark.parametrize("scenario", ["env_tiny.yaml", "env_tiny_two_gpus.yaml"])
def test_the_oracle_measures_every_offered_slot_and_matches_the_planner_where_it_does_not_depart(tmp_path, scenario):
    out = tmp_path / "labels.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--scenario", str(DATA / scenario), "--seeds", "0,1", "--every", "2",
                          "--horizon", "3", "--json", str(out), "--no-progress"], check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    episodes, labels = result["episodes"], result["labels"]
    assert [e["seed"] for e in episodes] == [0, 1]
    assert sum(line.startswith(f"{DATA / scenario} seed") for line in run.stdout.splitlines()) == 2  # a line per episode
    assert len(labels) == sum(e["decision_points"] for e in episodes) > 0
    for label in labels:
        assert label["step"] % 2 == 0
        assert len(label["observation"]) == CANDIDATES * len(CANDIDATE_FEATURES) + len(GLOBAL_FEATURES)
        assert str(label["planner_slot"]) not in label["advantages"]
    for episode in episodes:
        chosen = [label for label in labels if label["seed"] == episode["seed"] and any(a > 0 for a in label["advantages"].values())]
        assert episode["departures"] == len(chosen)
        if not chosen:  # the branches leave the episode as it was: it is the library planner's, to the unit
            assert episode["oracle"] == episode["planner-library"]


def test_bad_arguments_are_refused_by_name():
    run = subprocess.run([sys.executable, str(SCRIPT), "--scenario", str(DATA / "env_tiny.yaml"), "--every", "0"], capture_output=True, text=True)
    assert run.returncode != 0 and "--every" in run.stderr
    run = subprocess.run([sys.executable, str(SCRIPT), "--scenario", str(DATA / "env_tiny.yaml"), "--seeds", "a"], capture_output=True, text=True)
    assert run.returncode != 0 and "--seeds" in run.stderr
