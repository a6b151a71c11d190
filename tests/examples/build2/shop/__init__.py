"""Build 2 of examples/shop, for tests/examples/test_builds.py: shop_order changed, build 1's kept."""
