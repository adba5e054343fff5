import torch

from p2pfl.models import MLP, PeerStack, initial_parameters
from p2pfl.local.training import SGDSettings, train_epochs
from p2pfl.local.forward import evaluate


def setup(peers=4, n=60):
    torch.manual_seed(0)
    x = torch.randn(n * peers, 12)
    y = torch.randint(0, 3, (n * peers,))
    shards = [torch.arange(i * n, i * n + n - 7 * i) for i in range(peers)]  # unequal sizes
    model = MLP(12, [8], 3)
    flat = initial_parameters(model, list(range(peers)), seed=1, init="different", device=torch.device("cpu"))
    return model, flat, shards, x, y


def test_batched_training_equals_one_peer_at_a_time():
    model, flat, shards, x, y = setup()
    opt = SGDSettings(batch_size=16, epochs=3, momentum=0.9, weight_decay=1e-3)
    a, b = flat.clone(), flat.clone()
    la = train_epochs(PeerStack(model, batched=True), a, shards, [0, 1, 2, 3], x, y, opt, 0.1, 0, 0)
    lb = train_epochs(PeerStack(model, batched=False), b, shards, [0, 1, 2, 3], x, y, opt, 0.1, 0, 0)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(la, lb, atol=1e-6)
    assert not torch.allclose(a, flat)


def test_one_peer_matches_torch_sgd():
    model, flat, shards, x, y = setup(peers=1)
    opt = SGDSettings(batch_size=60, epochs=4, momentum=0.9)  # full batch: order irrelevant
    mine = flat.clone()
    train_epochs(PeerStack(model), mine, shards, [0], x, y, opt, 0.05, 0, 0)
    ref = MLP(12, [8], 3)
    torch.nn.utils.vector_to_parameters(flat[0].clone(), ref.parameters())
    sgd = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for _ in range(4):
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[shards[0]]), y[shards[0]]).backward()
        sgd.step()
    assert torch.allclose(mine[0], torch.nn.utils.parameters_to_vector(ref.parameters()), atol=1e-6)


def test_evaluate_matches_direct_forward():
    model, flat, _, x, y = setup()
    scores = evaluate(PeerStack(model), flat, x, y)
    acc, loss = scores["acc"], scores["loss"]
    for i in range(len(flat)):
        torch.nn.utils.vector_to_parameters(flat[i].clone(), model.parameters())
        with torch.no_grad():
            out = model(x)
        assert abs(float((out.argmax(1) == y).float().mean()) - float(acc[i])) < 1e-6
        assert abs(float(torch.nn.functional.cross_entropy(out, y)) - float(loss[i])) < 1e-5


def test_plain_sgd_batched_equals_one_peer_at_a_time():
    """The MLP fast path with SGD's step fused into the weight-gradient product (no momentum, no decay)."""
    model, flat, shards, x, y = setup()
    opt = SGDSettings(batch_size=16, epochs=3)
    a, b = flat.clone(), flat.clone()
    la = train_epochs(PeerStack(model, batched=True), a, shards, [0, 1, 2, 3], x, y, opt, 0.1, 0, 0)
    lb = train_epochs(PeerStack(model, batched=False), b, shards, [0, 1, 2, 3], x, y, opt, 0.1, 0, 0)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(la, lb, atol=1e-6)
    assert not torch.allclose(a, flat)


def test_a_peers_training_does_not_depend_on_what_shares_its_block(monkeypatch):
    """Bit for bit, whatever the block size: what keeps metrics equal on any number of ranks."""
    import p2pfl.local.training as training

    model, flat, shards, x, y = setup(peers=7)
    runs = []
    for block, momentum in [(24, 0.0), (1, 0.0), (3, 0.0), (24, 0.9), (2, 0.9)]:
        monkeypatch.setattr(training, "PEER_BLOCK", block)
        w = flat.clone()
        opt = SGDSettings(batch_size=16, epochs=2, momentum=momentum)
        losses = train_epochs(PeerStack(model), w, shards, list(range(7)), x, y, opt, 0.1, 0, 0)
        runs.append((momentum, w, losses))
    for momentum, w, losses in runs[1:]:
        first = next(r for r in runs if r[0] == momentum)
        assert torch.equal(w, first[1]) and torch.equal(losses, first[2])


def test_candidate_losses_of_mlps_equal_their_forward_passes():
    """NTK selection's batched MLP products give each candidate's loss as its own forward pass does."""
    from p2pfl.local.forward import candidate_losses

    for hidden in ([7], [8, 6], []):
        model = MLP(12, hidden, 4)
        stack = PeerStack(model)
        gen = torch.Generator().manual_seed(len(hidden))
        candidates = torch.randn(5, stack.layout.size, generator=gen) * 0.3
        x, y = torch.randn(9, 12, generator=gen), torch.randint(0, 4, (9,), generator=gen)
        direct = []
        for row in candidates:
            torch.nn.utils.vector_to_parameters(row, model.parameters())
            direct.append(torch.nn.functional.cross_entropy(model(x), y))
        assert torch.allclose(candidate_losses(stack, candidates, x, y), torch.stack(direct).detach(), atol=1e-6)
        mse = candidate_losses(stack, candidates, x, y, "mse")
        assert mse.shape == (5,) and torch.all(mse > 0)


def test_conv_nets_train_as_one_vmap_batch_as_a_gpu_runs_them():
    """On a GPU conv nets train as one vmap batch (dropout noise and batch norm's per-length groups
    included); forced here on the CPU, it equals one peer at a time within float rounding."""
    from p2pfl.models import build_model

    class Options:
        hidden, norm, rep_dim = [8], "batch", 2

    torch.manual_seed(0)
    x, y = torch.rand(120, 1, 28, 28), torch.randint(0, 10, (120,))
    shards = [torch.arange(i * 30, i * 30 + 30 - 6 * i) for i in range(4)]  # unequal: ragged last batches
    for name in ("cnn-fmnist", "resnet8"):  # dropout; batch norm
        model = build_model(name, (1, 28, 28), 10, Options())
        flat = initial_parameters(model, list(range(4)), seed=1, init="different", device=torch.device("cpu"))
        opt = SGDSettings(batch_size=8, epochs=1, momentum=0.9)
        runs = []
        for batched in (True, False):
            stack, w = PeerStack(model), flat.clone()
            assert not stack.batched  # the CPU's choice for conv nets
            stack.batched = batched
            runs.append((w, train_epochs(stack, w, shards, [0, 1, 2, 3], x, y, opt, 0.05, 3, 0)))
        (a, la), (b, lb) = runs
        assert not torch.allclose(a, flat)
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(la, lb, atol=1e-5), name


def test_peer_block_by_device():
    from p2pfl.local.training import PEER_BLOCK, peer_block

    model, *_ = setup()
    assert peer_block(PeerStack(model), 300, 25, (12,)) == PEER_BLOCK  # a CPU cache's worth of MLPs
    assert peer_block(PeerStack(model, batched=False), 300, 25, (12,)) == 1
    assert PeerStack(model).activation_bytes((12,)) > 3 * 4 * (8 + 3)  # the hidden and output units, at least


def test_evaluation_chunks_fit_the_budget_training_uses_and_give_the_same_scores(monkeypatch):
    """Evaluation is sized from the per-sample activation estimate and the rank's batch budget, as
    training is: a model that holds a lot per sample (resnet18 at 32x32 on a GPU) is evaluated in small
    chunks instead of the CPU's 10 peers x 2,000 samples per pass, and the scores do not depend on the chunks."""
    from p2pfl.local.forward import EVAL_PEERS_CPU, EVAL_SAMPLES_CPU, evaluation_chunks

    model, flat, shards, x, y = setup(peers=6)
    stack = PeerStack(model)
    per_sample = stack.activation_bytes((12,))
    assert evaluation_chunks(stack, 300, 10_000, (12,)) == (EVAL_PEERS_CPU, EVAL_SAMPLES_CPU)  # the CPU's passes
    whole = evaluate(stack, flat, x, y)
    for budget in (per_sample * 7, per_sample * 50, per_sample * 400):
        monkeypatch.setattr(PeerStack, "batch_budget", lambda self, b=budget: b)
        peers, samples = evaluation_chunks(stack, 6, len(x), (12,))
        assert peers * samples * per_sample <= budget and samples >= 1 and peers >= 1
        chunked = evaluate(stack, flat, x, y)
        assert torch.equal(chunked["acc"], whole["acc"]) and torch.allclose(chunked["loss"], whole["loss"], atol=1e-6)
    monkeypatch.setattr(PeerStack, "batch_budget", lambda self: 40 * 2**30)  # a GPU's share: all peers at once
    monkeypatch.setattr(stack, "device", torch.device("cuda"), raising=False)
    assert evaluation_chunks(stack, 300, 10_000, (12,))[0] == 300
    stack.device = torch.device("cpu")
    big = 22_315_129  # resnet18 at 32x32, measured by activation_bytes
    monkeypatch.setattr(PeerStack, "activation_bytes", lambda self, shape: big)
    peers, samples = evaluation_chunks(stack, 25, 10_000, (3, 32, 32))
    assert peers * samples * big <= 40 * 2**30 and samples < EVAL_SAMPLES_CPU


def test_train_loss_is_the_mean_over_the_calls_steps():
    """With lr 0, three batches of 20 cover a 60-sample shard each epoch: the mean of the step losses is
    the shard's loss (the last minibatch's alone is not)."""
    model, flat, shards, x, y = setup(peers=1)
    whole = evaluate(PeerStack(model), flat, x[shards[0]], y[shards[0]])["loss"][0]
    for momentum in (0.0, 0.9):  # the hand-written MLP step and the general one
        loss = train_epochs(
            PeerStack(model),
            flat.clone(),
            shards,
            [0],
            x,
            y,
            SGDSettings(batch_size=20, epochs=2, momentum=momentum),
            0.0,
            0,
            0,
        )
        assert abs(float(loss[0]) - float(whole)) < 1e-5
