"""The audit console: a read-only web page at `/console` over the public API (docs/console.md)."""
