"""Bytes per step of ZeRO-3 and ZeRO++ against counts done by hand."""

from __future__ import annotations

from models.train.traffic import Layout, TensorInfo, zero3_traffic, zeropp_traffic
from models.train.trainer import TrainConfig, Trainer


def test_small_model_by_hand() -> None:
    # Dense 32 -> 16 on 2 nodes x 2 workers, qwZ int8 in blocks of 16.
    tensors = [TensorInfo("w", (16, 32), True), TensorInfo("b", (16,), False)]
    layout = Layout(nodes=2, per_node=2)
    zero3 = zero3_traffic(tensors, layout)
    # fp16: 512 * 2 + 16 * 2 = 1056 bytes; an all-gather brings each rank the 3 shards it lacks,
    # 1 from its node and 2 from the other: summed over 4 ranks, 1056 intra and 2112 inter.
    assert [(c.intra_bytes, c.inter_bytes) for c in zero3.collectives] == [(1056, 2112)] * 3
    assert (zero3.intra_bytes, zero3.inter_bytes) == (3168, 6336)

    zpp = zeropp_traffic(tensors, layout, bits=8, block_size=16)
    got = {c.name.split(" (")[0]: (c.intra_bytes, c.inter_bytes) for c in zpp.collectives}
    # qwZ: 512 code bytes + 16 rows x 2 blocks x 4-byte scales = 640, plus the fp16 bias 32.
    assert got["forward all-gather"] == (672, 1344)
    # hpZ: inside each node each rank gets the other's half of 1056 fp16 bytes: 2 x 1 x 1056.
    assert got["backward all-gather"] == (2112, 0)
    # qgZ: 256 int4 code bytes + 32 groups (max(16, 32, 4)) x 4 = 384 bytes per gradient.
    assert got["gradient all-to-all inside nodes"] == (768, 0)
    assert got["gradient all-to-all across nodes"] == (0, 384)
    assert got["bias reduce-scatter"] == (32, 64)
    assert zpp.inter_bytes == 1792
    assert zpp.intra_bytes == 3584


def test_digits_model_traffic_ratio() -> None:
    trainer = Trainer(TrainConfig(bits=8, eval_every=0))
    zero3, zpp = trainer.traffic()
    params = sum(int(v.numpy().size) for v in trainer.network.parameters)
    assert params == 38282
    assert zero3.inter_bytes == 3 * 4 * 2 * params  # 3 collectives, (W - L) = 4, fp16
    assert zpp.inter_bytes / zero3.inter_bytes <= 0.3
