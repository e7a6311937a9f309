"""Tests of the background loop's sockets, connections, buffers and SASL."""
