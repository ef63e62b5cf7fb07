"""Grafana dashboards built in Python; ``python -m monitoring`` writes their JSON beside them."""
