"""The FP8 protocol (certificate V4): parameters, transcript, numerics, lottery, proofs, miner, verifier."""
from proof.fp8.lottery import (credited_work, fold_message, is_winner, lane_assignment, threshold,
                               ticket)
from proof.fp8.merkle_serde import MerkleProof
from proof.fp8.miner import (CommittedOperand, MiningResult, RoutingCommitment, build_plain_proof,
                             commit_operand, commit_routing, mine_cpu, routing_from_topk)
from proof.fp8.mma import fp8_matmul, fp8_matmul_with_stats
from proof.fp8.noise import noise_line, noise_lines
from proof.fp8.params import (AxisPattern, CommonParams, Device, DimType, HashId, JobParams, MoeParams,
                              OperandParams, ParamsError, Quant, TileShape, make_job, select_tile,
                              tile_max_k)
from proof.fp8.plain_proof import MatrixOpening, MoeWitness, PlainProofV4
from proof.fp8.policy import check_policy, grid_exponent
from proof.fp8.prequant import open_values, prequantize, row_norms
from proof.fp8.public_data import MoeStatement, PublicData
from proof.fp8.quantization import noise_dot, noisy_code, noisy_quantize, row_scales
from proof.fp8.transcript import (jackpot_key, key_a, key_b, noise_line_key, operand_digest, seed_a,
                                  seed_b, subkey, zk_public_digest)
from proof.fp8.verify import NOT_ADMISSIBLE, evaluate_plain_proof, verify_plain_proof

__all__ = [
    "NOT_ADMISSIBLE", "AxisPattern", "CommittedOperand", "CommonParams", "Device", "DimType", "HashId",
    "JobParams", "MatrixOpening", "MerkleProof", "MiningResult", "MoeParams", "MoeStatement",
    "MoeWitness", "OperandParams", "ParamsError", "PlainProofV4", "PublicData", "Quant",
    "RoutingCommitment", "TileShape", "build_plain_proof", "check_policy", "commit_operand",
    "commit_routing", "credited_work", "evaluate_plain_proof", "fold_message", "fp8_matmul",
    "fp8_matmul_with_stats", "grid_exponent", "is_winner", "jackpot_key", "key_a", "key_b",
    "lane_assignment", "make_job", "mine_cpu", "noise_dot", "noise_line", "noise_line_key",
    "noise_lines", "noisy_code", "noisy_quantize", "open_values", "operand_digest", "prequantize",
    "routing_from_topk", "row_norms", "row_scales", "seed_a", "seed_b", "select_tile", "subkey",
    "threshold", "ticket", "tile_max_k", "verify_plain_proof", "zk_public_digest",
]
