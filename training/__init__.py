"""DFlash drafter training (`toolflash train-draft`)."""
