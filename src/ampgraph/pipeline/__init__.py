"""The stages in one call: analyse a model spec in settings, in workers, through the cache."""
