"""Tests of the wire: codec, record batches (rows and columns), compression, the compiled decoder, generated errors."""
