"""Tests of TLS, mTLS, SASL on Kafka's listeners, ACLs, secrets kept out of every message."""
