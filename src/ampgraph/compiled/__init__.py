"""What ``torch.compile`` (Inductor) really runs: the compiled dtype flow, from Inductor's own plan."""
