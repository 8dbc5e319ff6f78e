"""The worker: serves a MoE model and mines Pearl inside its expert GEMMs (see docs/miner.md)."""
