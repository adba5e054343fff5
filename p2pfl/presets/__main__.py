from p2pfl.presets import listing

print(listing())
