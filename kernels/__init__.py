"""Custom kernels, each with a pure-MLX reference twin behind one switch."""
