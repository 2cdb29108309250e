"""Training: the backward pass of a training step and its check (what its records say, and the
saved memory they count, are :mod:`ampgraph.report.backward_ops` and :mod:`ampgraph.report.memory`)."""
