"""The User Library and the managed area: the Library's files and the organization's
Skills, synchronised into a sandbox and linked into its sessions. Built on
sandboxes.runtime."""
