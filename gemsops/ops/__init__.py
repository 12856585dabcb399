"""One module per op: the autograd Function and the functional wrapper."""
