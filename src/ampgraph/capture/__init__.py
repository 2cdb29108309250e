"""Stage 2, capture: trace a model into a torch.fx graph of ATen ops on fake tensors, per setting."""

# Meta kernels stricter than their real kernels are replaced on first import of the stage, so the
# trace, the replays and the eager-hook oracle all type those ops as a real run does.
from ampgraph.capture import meta_kernels as _meta_kernels  # noqa: F401
# Driverless stand-ins, and on torch 2.9 the CUDA device guard that 2.10 installs itself, are in
# place before any fake CUDA tensor is made.
from ampgraph.capture import driverless as _driverless  # noqa: F401
