"""Stage 3, annotation: what autocast does at every node, and the dispatcher check of it."""
