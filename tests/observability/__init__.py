"""Tests of metrics, OpenTelemetry, Prometheus, client metrics push, logging, the loop-lag watch."""
