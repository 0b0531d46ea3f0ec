"""Data-parallel training with ``DistributedDataParallel``: two processes (gloo on 127.0.0.1,
started with ``spawn``) training ``lstm_tvm.torch.LSTM`` on halves of each batch end with the
parameters of one process training on the whole batch.

DDP averages the two processes' gradients of their mean losses over ``B/2`` rows, which is the
gradient of the mean loss over all ``B`` rows: the runs differ only in float32 summation order
(one batch sum against two half sums and an average), compounded over a few SGD steps.
"""

import os
import socket

import numpy as np
import pytest
import tvm.testing

torch = pytest.importorskip("torch", reason="lstm_tvm.torch needs PyTorch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("PyTorch without torch.distributed's gloo backend", allow_module_level=True)

import lstm_tvm.torch as lt  # noqa: E402

T, B, I, H = 5, 4, 4, 6  # noqa: E741 - the registry's size symbols
STEPS, LR, WORLD = 4, 0.5, 2


def _data():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(-1, 1, (T, B, I)).astype(np.float32))
    target = torch.from_numpy(rng.uniform(-1, 1, (B, 1)).astype(np.float32))
    return x, target


def _model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"lstm": lt.LSTM(I, H, use_peephole=True),
                                "head": torch.nn.Linear(H, 1)})


def _train(model, step_model, rows: slice) -> list[float]:
    """SGD on the mean squared error of the head on the last output, rows ``rows`` of the
    batch; ``step_model`` is what is called (the model or its DDP wrapper)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, target = _data()
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        y = step_model(x[:, rows])
        loss = (y - target[rows]).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


class _Forward(torch.nn.Module):
    """The model's forward as one module (what DDP wraps)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y, _ = self.model["lstm"](x)
        return self.model["head"](y[-1])


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One DDP process: rows ``rank * B/2 ...`` of the batch; saves its final parameters."""
    os.environ["TVM_NUM_THREADS"] = "1"  # two processes share the cores
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        model = _model()
        ddp = torch.nn.parallel.DistributedDataParallel(_Forward(model))
        half = B // WORLD
        _train(model, ddp, slice(rank * half, (rank + 1) * half))
        torch.save({n: p.detach() for n, p in model.named_parameters()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ddp_on_two_processes_matches_one_process_on_the_whole_batch(tmp_path):
    model = _model()  # first here: the kernels compile once, the processes load them
    losses = _train(model, _Forward(model), slice(None))
    assert losses[-1] < losses[0]  # it trains
    want = {n: p.detach() for n, p in model.named_parameters()}
    torch.multiprocessing.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD,
                                join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name, value in want.items():
        assert torch.equal(results[0][name], results[1][name]), name  # DDP keeps them equal
        np.testing.assert_allclose(results[0][name].numpy(), value.numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


if __name__ == "__main__":
    tvm.testing.main()
