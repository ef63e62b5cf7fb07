"""Dashboards and alert rules shipped beside the operator (CONTRACT §11); not part of the installed package."""
