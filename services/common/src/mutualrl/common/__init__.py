"""Pieces every MutualRL service shares: typed config, auth, gRPC server and channel helpers."""
