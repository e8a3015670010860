"""PPO for rlsched: training (:mod:`.train`), its config (:mod:`.config`), domain
randomization (:mod:`.family`), TensorBoard callbacks (:mod:`.callbacks`) and ONNX export
(:mod:`.export`). Imports stay in the submodules so that loading a shipped policy does not
pull in torch."""
