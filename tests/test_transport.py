import torch

from p2pfl.comm import LocalTransport, Message, Placement, Tensors
from p2pfl.comm.mpi import pack, unpack


def test_placement_contiguous_blocks():
    p = Placement(10, 3)
    assert [p.peers_of(r) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [p.rank_of(i) for i in range(10)] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    star = Placement(10, 3, extra_on_root=1)
    assert star.nodes_of(0) == [0, 1, 2, 3, 10] and star.rank_of(10) == 0


def test_pack_roundtrip_all_dtypes():
    tensors = (
        torch.randn(3, 4),
        torch.arange(5, dtype=torch.int64),
        torch.tensor(2.5, dtype=torch.float64),
        torch.randn(7).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.zeros(0, 3),
        torch.randint(0, 255, (5,), dtype=torch.uint8),
        torch.randn(2, 3).half(),
    )
    msgs = [Message(0, 5, Tensors(tensors)), Message(1, 6, Tensors((torch.ones(2),)))]
    out = unpack(pack(msgs))
    assert [(s, d) for s, d, _ in out] == [(0, 5), (1, 6)]
    for a, b in zip(tensors, out[0][2]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_local_exchange_delivers_and_counts_bytes():
    t = LocalTransport(4)
    msgs = [
        Message(0, 1, Tensors((torch.ones(10),))),
        Message(2, 1, Tensors((torch.zeros(5), torch.ones(1, dtype=torch.int64)))),
        Message(3, 0, Tensors((torch.ones(4),)), dense_nbytes=100),
    ]
    inbox = t.exchange("x", 0, msgs, [(0, 1), (2, 1), (3, 0)])
    assert torch.equal(inbox[1][0].items[0], torch.ones(10)) and len(inbox[1][2].items) == 2
    sent, dense, _ = t.counter.take()
    assert sent == {"x": 40 + 20 + 8 + 16} and dense == {"x": 40 + 28 + 100}
    assert t.counter.take() == ({}, {}, 0)
