"""One module per decoding method: the only place methods differ."""
