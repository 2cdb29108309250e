"""Stage 2, capture: trace a model into a torch.fx graph of ATen ops on fake tensors, per setting.

Importing it changes nothing in torch: the kernels an analysis needs replaced are in place only
inside :func:`ampgraph.capture.environment.analysis_environment`.
"""
