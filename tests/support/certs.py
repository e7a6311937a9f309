"""Test certificates: the package's own generator (``asyncconsumer.testing.certs``)."""

from asyncconsumer.testing.certs import TLSMaterial, generate_certs

__all__ = ["TLSMaterial", "generate_certs"]
