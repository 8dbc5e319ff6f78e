"""Job key, salts and the seed chain: int-protocol.md §2–3 and the §9.1 / §9.4 vectors."""
import struct

import blake3
import pytest

from proof.int7 import (SEED_SALT_A, SEED_SALT_B, Int7Error, MiningConfig, commitment, job_key,
                        noise_seeds, offsets_hash, routing_fold)

JOB_KEY = bytes([0x11]) * 32
HASH_A = bytes([0xAA]) * 32
HASH_B = bytes([0xBB]) * 32
TEST_HEADER = bytes(4) + bytes([1]) * 32 + bytes([2]) * 32 + bytes.fromhex("66666666") + bytes.fromhex("ffff7f20")


def test_salt_constants():
    assert SEED_SALT_A.hex() == "8249406ca0ed15169616f692fcf076f892dbdb2a7023b852f0d47719c390017b"
    assert SEED_SALT_B.hex() == "11300632ec6301ca2be2af718b3f4d4f1ae9c63988e8cc044844301d71b89aa9"


def test_legacy_seed_chain():
    s_b, s_a = noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=False)
    assert s_b.hex() == "add6f7ea5feebf89c8a77e2ebfa0d82442e7dbb0046dbd48971861d12fcb0177"
    assert s_a.hex() == "483b07b6f73105030b9482255f37723f3fed69ae916724ee8291848b8c28794b"


def test_salted_seed_chain():
    s_b, s_a = noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=True, m=192, n=320)
    assert s_b.hex() == "60ed9b73c5a9599b200b6cd563e7f0d5d9a67d2402d85fd4ef966c580080d0e5"
    assert s_a.hex() == "301784168005ec833ab0aa60006f7fe7faaa95307d8c1fc6819b2ffdd717eccf"


def test_salted_moe_seed_chain_folds_routing_after_salting():
    h_o = offsets_hash(JOB_KEY, [3, 5, 9, 12])
    assert h_o == blake3.blake3(struct.pack("<4I", 3, 5, 9, 12) + bytes(1024 - 16), key=JOB_KEY).digest()
    h_r = bytes([0xCC]) * 32
    s_b, s_a = noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=True, m=192, n=320, routing_hash=h_r,
                           offsets_hash=h_o)
    salted_s_b, salted_s_a = noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=True, m=192, n=320)
    assert s_b == salted_s_b  # the routing only enters s_A
    bound_a = blake3.blake3(HASH_A + struct.pack("<I", 192) + bytes(28), key=SEED_SALT_A).digest()
    assert s_a == blake3.blake3(s_b + routing_fold(bound_a, h_r, h_o)).digest() != salted_s_a


def test_seed_argument_errors():
    with pytest.raises(Int7Error, match="need m and n"):
        noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=True)
    with pytest.raises(Int7Error, match="both routing_hash and offsets_hash"):
        noise_seeds(JOB_KEY, HASH_A, HASH_B, salted=False, routing_hash=HASH_A)
    with pytest.raises(Int7Error, match="hash_a must be 32 bytes"):
        noise_seeds(JOB_KEY, HASH_A[:31], HASH_B, salted=False)


def test_test_header_bytes_and_job_key():  # int-protocol.md §9.4
    assert TEST_HEADER.hex() == "00000000" + "01" * 32 + "02" * 32 + "66666666" + "ffff7f20"
    config = MiningConfig(2048, 128, [0, 8, 64, 72], [0, 1, 8, 9, 32, 33, 40, 41])
    assert job_key(TEST_HEADER, config) == blake3.blake3(TEST_HEADER + config.to_bytes()).digest()
    with pytest.raises(Int7Error, match="76 bytes"):
        job_key(TEST_HEADER[:75], config)


def test_commitment_is_keyed_hash_of_padded_data():
    data = bytes(range(256)) * 5
    assert commitment(JOB_KEY, data) == blake3.blake3(data + bytes(2048 - len(data)), key=JOB_KEY).digest()
