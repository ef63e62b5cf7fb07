"""The allocation core: node inventory, filtering, scoring, device choice and the device ledger.

Pure and fast: no kopf, aiohttp, kubernetes or kmock imports (enforced by import-linter), so it can
be tested table-driven and benchmarked at cluster scale without an API server.
"""
