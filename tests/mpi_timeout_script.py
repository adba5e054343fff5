"""Run under mpirun -n 2: rank 1 never sends, so rank 0 must time out naming peer 1."""

import sys

import torch

from p2pfl.comm import CommTimeout, Message, Tensors, make_transport

t = make_transport(peers=2, timeout=1.5)
if t.rank == 0:
    try:
        t.exchange("average", 3, [Message(0, 1, Tensors((torch.ones(3),)))], [(1, 0)])
    except CommTimeout as exc:
        print("TIMEOUT", exc)
        sys.stdout.flush()
t.barrier()
