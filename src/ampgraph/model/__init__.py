"""Stage 1, the model: which model to analyse, said how, built on the meta device (no weights)."""
