"""Connecting to a cluster the way kubectl does (KUBECONFIG, in-cluster), shared by every command."""
