"""Notifications quor sends to the packages above it, which it does not import (the
convention of sandboxes/signals.py: sent synchronously, in the sender's transaction)."""

from django.dispatch import Signal

# Sent by quor.services.user_deactivate inside the transaction that takes a user's
# access away, and again each time it is run for an inactive user (to finish what a
# crash left half done): receivers fail what waits on the user and queue the rest.
# Arguments: user.
user_deactivated = Signal()
