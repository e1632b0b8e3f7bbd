"""Run by tests/train/test_rl.py, alone or under torchrun: every rank applies one RLOO update to its
share of the same fixed sequences; rank 0 writes the grad norm and the weights to OUT."""

import random
import sys

import torch
import torch.distributed as dist

from otbuild.settings.train import Rl
from otbuild.train.dist import init_distributed
from otbuild.train.rl.loss import TokenSequence, update
from otbuild.train.rl.trainer import make_engine


def main(model_dir: str, out: str) -> None:
    init_distributed(False)
    rank, world = dist.get_rank(), dist.get_world_size()
    settings = Rl(steps=1, learning_rate=1e-2, micro_batch_tokens=64, zero_stage=2)
    engine, _ = make_engine(settings, model_dir, on_gpu=False)
    rng = random.Random(0)
    seqs = []
    for _ in range(7):
        n = rng.randint(6, 14)
        cut = rng.randint(2, n - 2)
        seqs.append(
            TokenSequence(
                [rng.randrange(5, 300) for _ in range(n)],
                [False] * cut + [True] * (n - cut),
                advantage=rng.choice([-1.0, 0.0, 0.5, 1.5]),
            )
        )
    stats = update(engine, seqs[rank::world], settings, 0)
    if rank == 0:
        torch.save({"grad_norm": stats["grad_norm"], "weights": engine.module.state_dict()}, out)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
