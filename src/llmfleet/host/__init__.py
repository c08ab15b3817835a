"""One host: the SSH layer, the probe script and the facts parsed from its output."""
