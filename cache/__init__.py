"""Prefix cache of session snapshots: L1 RAM + L2 disk, guarded for coherent reuse."""
