"""Byzantine peers and the rules that withstand them, on the graph.

- attacks.py: what a Byzantine peer sends (sign flip, Gaussian, ALIE, IPM, dissensus, label flipping),
  each one function in a registry, from what the attacker may know (AttackView);
- robust.py: how an honest peer averages what it heard (ClippedGossip's self-centered clipping, trimmed
  mean, coordinate-wise median, Krum), each one function in a registry, over its neighbourhood;
- byzantine.py: a run's threats: which peers attack (drawn from the seed), the attack and the rule the
  settings choose (a user's own by package.module:name), and a peer's average under them;
- privacy.py: the epsilon a DP-SGD run (--dp-clip, --dp-noise) spends, from the dp-accounting library.
"""

from p2pfl.threats.attacks import ATTACKS, AttackView
from p2pfl.threats.byzantine import Threats, threats_of
from p2pfl.threats.robust import RULES, Neighbourhood

__all__ = ["ATTACKS", "AttackView", "RULES", "Neighbourhood", "Threats", "threats_of"]
