"""Review: findings (audit), differences (diff), the CI gate (baseline), what-if moves, sources."""
