"""The FP8 protocol (certificate V4): parameters, transcript, lottery, plain proofs and public data."""
from proof.fp8.lottery import (credited_work, fold_message, is_winner, lane_assignment, threshold,
                               ticket)
from proof.fp8.merkle_serde import MerkleProof
from proof.fp8.params import (AxisPattern, CommonParams, Device, DimType, HashId, JobParams, MoeParams,
                              OperandParams, ParamsError, Quant, TileShape, select_tile, tile_max_k)
from proof.fp8.plain_proof import MatrixOpening, MoeWitness, PlainProofV4
from proof.fp8.public_data import MoeStatement, PublicData
from proof.fp8.transcript import (jackpot_key, key_a, key_b, noise_line_key, operand_digest, seed_a,
                                  seed_b, subkey, zk_public_digest)

__all__ = [
    "AxisPattern", "CommonParams", "Device", "DimType", "HashId", "JobParams", "MatrixOpening",
    "MerkleProof", "MoeParams", "MoeStatement", "MoeWitness", "OperandParams", "ParamsError",
    "PlainProofV4", "PublicData", "Quant", "TileShape", "credited_work", "fold_message",
    "is_winner", "jackpot_key", "key_a", "key_b", "lane_assignment", "noise_line_key",
    "operand_digest", "seed_a", "seed_b", "select_tile", "subkey", "threshold", "ticket",
    "tile_max_k", "zk_public_digest",
]
