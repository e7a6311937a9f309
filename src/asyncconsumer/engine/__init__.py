"""The background engine: network client, event loop, fetch buffer."""
