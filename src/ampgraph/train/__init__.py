"""Training: the backward pass of a training step, its check, saved memory, formats and verify."""
