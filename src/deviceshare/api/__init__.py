"""The public vocabulary of deviceshare (CONTRACT §1–4): names, models, env-var mapping.

Pure data: nothing here talks to a cluster, so every layer may import it.
"""
