"""Test-only helpers: builders and drivers the library does not ship."""
