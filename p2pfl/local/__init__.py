"""What a peer computes on its own data, for all of a rank's peers in one batch: the local layer under the
algorithms, the NTK math and the measuring.

- training.py: local SGD steps and epochs (masks for unequal shards, momentum, proximal terms);
- gradients.py: the gradients of the peers' minibatch losses (closed form for MLPs, torch.func else);
- forward.py: models on samples without training (test metrics, candidate models' losses).
"""
