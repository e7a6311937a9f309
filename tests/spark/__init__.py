"""Tests of the PySpark data source (``asyncconsumer.spark``); marker ``spark``."""
