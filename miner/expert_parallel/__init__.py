"""Expert parallelism with mining on every rank (docs/expert-parallel.md).

- ``plan``: which rank owns which experts.
- ``exchange``: the all-to-all dispatch of (token, slot) rows and the combine back.
- ``moe``: the expert-parallel MoE block and ``shard_model``.
- ``winners``: per-rank proof building and the relay of winners to rank 0's submitter.
- ``sync``: the per-step control broadcast and winner gather (gloo).
- ``host``: rank 0's job poller, submitter and control state.
- ``runtime``: one rank of the worker; ``distributed``: joining the group.
- ``run``: the torchrun entry point; ``scaling``: tokens/s over 1, 2, 4 GPUs.
"""
