"""The session's interactive terminal (services.py says how it works)."""
