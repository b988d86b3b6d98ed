"""Python SDK: typed clients for SEE, THL and MWRA (sync and asyncio)."""
