"""The INT protocol (certificates V1, V2, V3; dense and MoE): int-protocol.md.

Pure CPU (numpy + blake3). Configuration, seeds, noise, transcript, tickets and bounds, plain
proofs and public data, the CPU reference miner and the plain-proof verifier.
"""
from .config import CONFIG_SIZE, MiningConfig
from .errors import Int7Error
from .miner import (Instance, TileWin, build_proof, commit_instance, instance_tickets, instance_transcripts,
                    mine_cpu, mining_bound)
from .noise import (LABEL_A, LABEL_B, apply_sparse, noise_a_rows, noise_b_cols, noised, prng_block,
                    sparse_factor, uniform_factor)
from .pattern import PeriodicPattern, list_to_pattern
from .peel import peel, sparse_matrix
from .plain_proof import MatrixOpening, MerkleOpening, MoEOpening, PlainProof, min_cert_version
from .public_data import (MAX_PUBLIC_DATA_SIZE, MIN_MOE_PUBLIC_DATA_SIZE, PUBLIC_DATA_SIZE, PublicData,
                          config_and_jackpot)
from .routing import end_offsets, flatten, random_routing
from .seeds import SEED_SALT_A, SEED_SALT_B, commitment, job_key, noise_seeds, offsets_hash, routing_fold
from .target import PENALTY_BASE_RANK, meets_bound, penalized_bound, ticket_value, unpenalized_bound
from .transcript import chunk_dot_products, fold_chunks, ticket, tile_transcripts, transcript_words
from .verifier import public_data, verify_plain_proof

__all__ = [
    "CONFIG_SIZE", "Instance", "Int7Error", "LABEL_A", "LABEL_B", "MAX_PUBLIC_DATA_SIZE",
    "MIN_MOE_PUBLIC_DATA_SIZE", "MatrixOpening", "MerkleOpening", "MiningConfig", "MoEOpening",
    "PENALTY_BASE_RANK", "PUBLIC_DATA_SIZE", "PeriodicPattern", "PlainProof", "PublicData",
    "SEED_SALT_A", "SEED_SALT_B", "TileWin", "apply_sparse", "build_proof", "chunk_dot_products",
    "commit_instance", "commitment", "config_and_jackpot", "end_offsets", "flatten", "fold_chunks",
    "instance_tickets", "instance_transcripts", "job_key", "list_to_pattern", "min_cert_version",
    "meets_bound", "mine_cpu", "mining_bound", "noise_a_rows", "noise_b_cols", "noise_seeds", "noised",
    "offsets_hash", "peel", "penalized_bound", "prng_block", "public_data", "random_routing",
    "routing_fold", "sparse_factor", "sparse_matrix", "ticket", "ticket_value", "tile_transcripts",
    "transcript_words", "uniform_factor", "unpenalized_bound", "verify_plain_proof",
]
