"""Target adapters, one per model family, behind the `TargetAdapter` protocol."""
