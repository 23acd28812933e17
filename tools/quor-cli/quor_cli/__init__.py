"""Quor's command line client, installable on its own (no Django, no Quor)."""
