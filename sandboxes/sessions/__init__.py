"""Sessions and agent turns: creating them, follow-ups, cancelling, the agent's
events (stored, then published) and their live stream. Built on sandboxes.library and
sandboxes.runtime."""
