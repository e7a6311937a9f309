"""Tests of Schema Registry deserializers on a real registry (Apicurio)."""
