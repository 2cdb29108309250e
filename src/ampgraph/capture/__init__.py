"""Stage 2, capture: trace a model into a torch.fx graph of ATen ops on fake tensors, per setting."""
