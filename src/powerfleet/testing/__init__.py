"""Fixtures the tests and the benchmarks share: the parsers' fuzz targets, a small retune world.

They live in the package, not under tests/, so bench/ never imports a test module (and the
image's unit tests, which copy only src/ and tests/, still find them). Nothing in the fleet
or the twin imports this package.
"""
