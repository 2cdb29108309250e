"""Stage 2, capture: trace a model into a torch.fx graph of ATen ops on fake tensors, per setting."""

# Meta kernels stricter than their real kernels are replaced on first import of the stage, so the
# trace, the replays and the eager-hook oracle all type those ops as a real run does.
from ampgraph.capture import meta_kernels as _meta_kernels  # noqa: F401
