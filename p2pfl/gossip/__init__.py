"""What crosses an edge when peers gossip their weights, and how its bits travel.

- codecs.py: the codecs (dense, top-k, random-k, QSGD), each declared once in a registry;
- codec_settings.py: the gossip flags derived from the registry, and the codec they choose;
- bitpack.py: b-bit values and boolean masks packed into bytes, as a wire carries them.
"""
