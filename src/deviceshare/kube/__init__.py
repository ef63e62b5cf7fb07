"""Connecting to a cluster the way kubectl does (KUBECONFIG, in-cluster), shared by every command.

``connecting`` builds an ApiClient; ``watching`` mirrors a collection into memory with list+watch.
"""
