"""The DFlash engine on MLX: targets, drafter, one session with speculative and AR modes."""
