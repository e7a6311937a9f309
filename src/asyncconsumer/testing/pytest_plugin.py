"""pytest plugin (fixtures for applications tests): see docs/pytest-plugin.md."""
